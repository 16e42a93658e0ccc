"""Settings as the command line names them: each problem the library words by field
(``fetch_every``) is shown with the flag that sets it (``--fetch-every``)."""
from __future__ import annotations

import argparse
from typing import Dict


def flag_names(parser: argparse.ArgumentParser) -> Dict[str, str]:
    """The flag of each setting, by the field it sets (its ``dest``): the longest spelling,
    the first flag when several set one field (``--progress`` before ``--quiet``)."""
    names: Dict[str, str] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in names:
            names[action.dest] = max(action.option_strings, key=len)
    return names
