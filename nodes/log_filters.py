"""Start-up log lines that are noise for a ComfyUI user.

bitsandbytes (0.49+) tries, on import, to fetch an optional CPU NF4 kernel from the `kernels` hub package and warns
on every start when that package is absent ("Failed to load CPU gemm_4bit_forward from kernels-community"). The
pack runs its CPU path without it, so the line is dropped from that one logger (kept at debug level).
"""
from __future__ import annotations

import logging

BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
OPTIONAL_KERNEL = "from kernels-community"


class _OptionalKernelNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and OPTIONAL_KERNEL in str(record.msg):
            logging.getLogger(__name__).debug("bitsandbytes: %s", record.getMessage())
            return False
        return True


def quiet_optional_kernel_warning() -> None:
    """Install the filter (idempotent); call before bitsandbytes is first imported."""
    logger = logging.getLogger(BNB_CPU_LOGGER)
    if not any(isinstance(f, _OptionalKernelNotice) for f in logger.filters):
        logger.addFilter(_OptionalKernelNotice())
