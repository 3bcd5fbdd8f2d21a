"""Encoders the benchmarks compare that the package does not ship: a Model2Vec model
distilled from the bundled one."""

from __future__ import annotations

import logging
import time
from pathlib import Path

__all__ = ["distil_model2vec"]

LOG = logging.getLogger(__name__)


def distil_model2vec(target: Path) -> Path | None:
    """A Model2Vec model distilled from the bundled model (its defaults), or None if impossible."""
    if (target / "model.safetensors").is_file():
        return target
    try:
        from model2vec.distill import distill

        from flowsearch.encode.model_files import bundled_model_dir

        started = time.process_time()
        model = distill(model_name=str(bundled_model_dir()))
        model.save_pretrained(str(target))
        LOG.info("distilled Model2Vec in %.0f CPU s", time.process_time() - started)
        return target
    except Exception as exc:  # noqa: BLE001 - any failure: report and skip the comparison
        LOG.warning("Model2Vec distillation unavailable (%s); skipping it", exc)
        return None
