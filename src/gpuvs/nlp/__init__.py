"""NLP models for the ner-* / tc-* workloads and the gRPC service: a generated corpus (corpus.py),
tokenisation, vocabularies and metrics (data.py), PyTorch models (models.py), training (train.py),
prediction (predict.py) and model files (checkpoint.py). corpus.py and data.py need no framework."""
