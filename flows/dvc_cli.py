"""``dvc`` itself (its own ``dvc.cli.main``), less one warning: ``'<path>' is empty.`` for the optional human-annotated
pairs, which are empty by default (``validate.human_pairs`` and their validated copy), so that every run does not
print it 7 times (issue 19: "quiet by default: no empty-file warnings"). Any other empty file still warns.

`flows.pipeline.repro_stage` runs stages as ``python -m flows.dvc_cli repro --single-item <stage>``; the arguments
and exit status are dvc's.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import yaml

from flows.paths import VALID_PAIRS

EMPTY_WARNING = "'%s' is empty."  # dvc.output.Output.save's message


def optional_inputs(params_path: Path = Path("params.yaml")) -> set[str]:
    """The files that may be empty by design: ``validate.human_pairs`` (params.yaml's, when it names one) and its
    validated copy, as repository-relative POSIX paths."""
    paths = {VALID_PAIRS.as_posix()}
    try:
        human = yaml.safe_load(params_path.read_text())["validate"]["human_pairs"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return paths
    return paths | {Path(human).as_posix()}


class SkipEmptyWarning(logging.Filter):
    """Drops dvc's "is empty" warning for the paths given (as dvc prints them); every other record passes."""

    def __init__(self, paths: set[str]):
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == EMPTY_WARNING and record.args and str(record.args[0]) in self.paths)


def main(argv: list[str] | None = None) -> int:
    import dvc.output
    from dvc.cli import main as dvc_main

    dvc.output.logger.addFilter(SkipEmptyWarning(optional_inputs()))
    return dvc_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
