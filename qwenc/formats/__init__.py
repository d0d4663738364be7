"""Model files: safetensors and GGUF readers, config.json and generation_config.json, and where
a model name or path leads."""
