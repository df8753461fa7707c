"""Pure transforms of ncnn graphs: `.param` text (and `.bin` bytes) in, the same computation in another form out."""
