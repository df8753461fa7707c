"""Audio: wav I/O and the wire formats, the compressed formats (encode), speed at the same pitch (tempo), voice-clip
checks, the mel frontend, the split RVQ."""
