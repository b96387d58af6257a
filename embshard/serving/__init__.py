"""Serving sharded tables for inference: export artifacts, quantized tables, HTTP server."""
