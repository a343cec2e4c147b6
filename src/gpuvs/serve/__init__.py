"""The gRPC NLP service (nlp.proto): request checks (validate.py), saved and loaded models
(models.py), the service and its server (server.py), a client's channel (client.py). nlp_pb2*.py are
generated from nlp.proto by codegen.py and checked in."""
