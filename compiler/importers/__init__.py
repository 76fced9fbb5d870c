"""Importers: models in other frameworks' formats as GIR modules (`gc import model.onnx`)."""
