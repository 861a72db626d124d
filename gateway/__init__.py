"""vllm-gateway: an OpenAI-compatible API gateway in front of self-hosted vLLM servers."""

__version__ = "0.1.0"
