"""Inference engines behind one interface (``base.Engine``); ``factory.create_engine`` picks one."""
