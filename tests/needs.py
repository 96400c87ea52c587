"""Skip markers for tests that need software outside the test extra, so a checkout without it skips them with a
reason instead of failing (CI installs all of it and runs them)."""
import importlib.util
import shutil

import pytest


def _scoring_skip_reason() -> str | None:
    if importlib.util.find_spec("pycocoevalcap") is None:
        return "scoring needs pycocoevalcap (pip install edgecap[metrics])"
    if shutil.which("java") is None:
        return "scoring needs java on PATH (pycocoevalcap's tokenizer and METEOR run on it)"
    return None


_SCORING_SKIP_REASON = _scoring_skip_reason()
needs_scoring = pytest.mark.skipif(_SCORING_SKIP_REASON is not None, reason=_SCORING_SKIP_REASON or "")
