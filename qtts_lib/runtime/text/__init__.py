"""Text: the BPE tokenizer and the sentence segmenter (stdlib only)."""
