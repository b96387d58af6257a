"""Serving sharded tables for inference: export artifacts, quantized tables, HTTP server."""

from embshard.extras import require

require("embshard-serve and embshard-export (embshard.serving)", "torch", "serve")
