"""quantkit/quiet.py: library chatter kept off the terminal, and only the chatter that says nothing."""

import logging

import torch


class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 4)


def _unmatched_warnings(caplog, targets):
    from compressed_tensors.utils.match import match_named_modules

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compressed_tensors.utils.match"):
        list(match_named_modules(_Two(), targets, [], warn_on_fail=True))
    return [r.getMessage() for r in caplog.records if "Could not match" in r.getMessage()]


def test_compressed_tensors_false_unmatched_warning_is_dropped(caplog):
    """The upstream fault: a regex target after the class target "Linear" (every mixed-precision
    artifact's config_groups) is reported unmatched though it matches. quiet_libraries drops it."""
    from quantkit.quiet import _spurious_unmatched_target, quiet_libraries

    logger = logging.getLogger("compressed_tensors.utils.match")
    logger.removeFilter(_spurious_unmatched_target)
    # compressed-tensors as it is: `re:.*fc$` matches `fc`, yet it warns (if this fails, the fault is fixed upstream
    # and the filter in quiet.py can go)
    assert _unmatched_warnings(caplog, ["Linear", "re:.*fc$"]) == ["Could not match `re:.*fc$` in instance of _Two"]
    quiet_libraries()
    try:
        assert _unmatched_warnings(caplog, ["Linear", "re:.*fc$"]) == []
    finally:
        logger.removeFilter(_spurious_unmatched_target)


def test_debug_keeps_every_library_message(caplog):
    from quantkit.quiet import _spurious_unmatched_target, quiet_libraries

    logger = logging.getLogger("compressed_tensors.utils.match")
    logger.removeFilter(_spurious_unmatched_target)
    quiet_libraries(debug=True)
    assert _unmatched_warnings(caplog, ["Linear", "re:.*fc$"])
