"""The model: config, embeddings, prompt, voices, sampling, precision tiers, the generation loop, the Synthesizer."""
