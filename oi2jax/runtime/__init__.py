"""Host-side runtime: `Program` (program.py: constants, jitted kernels, growth, errors), the
kernels a session runs (kernels.py), decode-loop sessions (session.py), the yield/await driver
(driver.py) and its kernel builder/scheduler (executor.py), batch chunks (chunked.py), and
sharding over a mesh (sharding.py). See docs/architecture.md and docs/decode.md."""
from .program import Program
from .session import Session

__all__ = ["Program", "Session"]
