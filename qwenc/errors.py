"""qwenc's exceptions: one family, so callers can catch what qwenc raises apart from bugs.

Every error that bad input can cause is a QwencError. Those about a model's files are
ModelFormatError (a ValueError), each naming the file and what is wrong with it; those about a
request (a prompt too long for the context, a sampling setting out of range) are
InvalidRequest. The HTTP server maps the families onto status codes.
"""


class QwencError(Exception):
    """Base of every exception qwenc raises on purpose."""


class ModelFormatError(QwencError, ValueError):
    """A model file (weights, config, tokenizer, template) is malformed, inconsistent or of a kind
    qwenc cannot compute with."""


class ConfigError(ModelFormatError):
    """config.json (or a GGUF's metadata) holds values qwenc cannot use."""


class WeightError(ModelFormatError):
    """A weight tensor is missing, misshapen or of a type the kernels cannot compute with."""


class WeightFileError(WeightError):
    """A safetensors file (or its index) is malformed."""


class GGUFError(WeightError):
    """A GGUF file is malformed or holds something this reader does not support."""


class TokenizerError(ModelFormatError):
    """tokenizer.json, tokenizer_config.json (or a GGUF's tokenizer metadata) is malformed."""


class UnsupportedTokenizer(TokenizerError, NotImplementedError):
    """A well-formed tokenizer whose pipeline qwenc does not implement (refused rather than
    tokenized differently)."""


class ChatTemplateError(ModelFormatError):
    """The chat template does not parse, raises, or runs too long."""


class ModelNotFound(QwencError, FileNotFoundError):
    """A model name or path leads nowhere (and, for hub ids, how to get it)."""


class DemoModelMissing(ModelNotFound):
    """The demo model's packages are not installed."""


class InvalidRequest(QwencError, ValueError):
    """A generation request is invalid: bad sampling settings, an empty prompt, ..."""


class ContextLengthExceeded(InvalidRequest):
    """A prompt (plus the tokens asked for) does not fit the context, or could never fit the KV
    cache."""

    code = "context_length_exceeded"


class Cancelled(QwencError):
    """A computation was stopped on request (between two steps or prefill chunks)."""


class QueueFull(QwencError, RuntimeError):
    """The engine's queue of waiting requests is full: try again later."""


class EngineStopped(QwencError, RuntimeError):
    """The engine was shut down (or failed) before the request finished."""


class ConstraintViolation(QwencError, RuntimeError):
    """A token was fed to a grammar matcher that does not allow it (a sampler bypassed the
    mask), or a matcher ran past the grammar engine's limits for one step."""
