"""Adapters that make the OpenAI and Anthropic Python SDK clients resumable (SDKs imported lazily)."""

from .anthropic_sdk import resumable_anthropic
from .openai_sdk import resumable_openai

__all__ = ["resumable_anthropic", "resumable_openai"]
