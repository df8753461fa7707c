"""Audio: wav I/O and the wire formats, voice-clip checks, the mel frontend, the split RVQ."""
