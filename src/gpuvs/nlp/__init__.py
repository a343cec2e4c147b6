"""NLP models for the ner-* / tc-* workloads and the gRPC service.

A generated corpus (corpus.py), tokenisation, vocabularies and metrics (data.py), PyTorch models (models.py).
Training (train.py), prediction (predict.py), model files (checkpoint.py). corpus.py and data.py need no framework."""
