"""Images of frames: decoding, the kept picture, recycled pixel memory. Pure and synchronous."""
