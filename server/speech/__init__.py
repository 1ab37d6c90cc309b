"""Voice stages for engines that cannot speak or listen: synthesis, transcription and
voice activity detection (interfaces in ``base``, chosen by ``factory``)."""
