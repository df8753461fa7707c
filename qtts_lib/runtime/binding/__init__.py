"""ncnn through its Python binding: Mats, nets, extractors, the `.param` and `.bin` formats, cached decoders."""
