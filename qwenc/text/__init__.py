"""Text: the tokenizer, chat templates, and streamed detokenization with stop strings."""
