"""Command-line tools (training the tokenizer, ...)."""
