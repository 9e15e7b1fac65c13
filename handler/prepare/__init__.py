"""Offline model preparation: AWQ quantization (`python -m handler.prepare.quantize`) and the
embedded default model built from it (`python -m handler.prepare.default_model`)."""
