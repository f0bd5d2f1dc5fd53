"""The OpenInfer DSL front end: `parse` / `parse_file` (text -> `ir.Graph`), `fmt.format_graph`."""
from .parse import parse, parse_file

__all__ = ["parse", "parse_file"]
