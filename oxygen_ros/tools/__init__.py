"""Command-line tools: oxygen-agent (with its status line, report and arrival probe),
oxygen-soak, oxygen-bench, oxygen-calibrate, oxygen-train, oxygen-eval, training the tokenizer."""
