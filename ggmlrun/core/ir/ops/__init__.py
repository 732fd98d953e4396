"""Every op of SPEC.md section 2 and docs/format.md. Importing this package registers them all."""

from ggmlrun.core.ir.ops.registry import OPS, REQUIRED, OpResult, OpSpec, get_op, make_node, register
from ggmlrun.core.ir.ops import (elementwise, flash_attn, layout, llm, matmul,  # noqa: F401
                                 moe, nn, recurrent, reduce, rope)  # (registers)

__all__ = ["OPS", "REQUIRED", "OpResult", "OpSpec", "get_op", "make_node", "register"]
