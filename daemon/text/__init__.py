"""Text around token ids: the tokenizer and chat template, incremental detokenization, stop strings."""
