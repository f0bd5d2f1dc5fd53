"""Host-side runtime: decode-loop sessions (session.py). See docs/decode.md."""
from .session import Session

__all__ = ["Session"]
