"""The codec: codes (T, 16) to a 24 kHz waveform, whole or streamed."""
