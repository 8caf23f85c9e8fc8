"""The bad-input suite's harness (:mod:`.common`) and its case tables by area.

``tests/test_bad_input.py`` runs its own table plus :data:`EXTRA_CASES`: the cases of

* :mod:`.server` -- model-server configurations and misbehaving servers (a fault-injecting loopback server);
* :mod:`.run_folder` -- run folders of another configuration, locked or finished run folders;
* :mod:`.values` -- values out of range, sizes that cannot fit, silently coerced inputs, odd files;
* :mod:`.private_data` -- user data files that must not be copied outside the run folder;
* :mod:`.finetune` -- ``snapaudit finetune``: its data files, keys, settings the data or the model refute, the base
  model, ``--plan``, run folders.
"""

from tests.helpers.bad_input import finetune, private_data, run_folder, server, values

EXTRA_CASES = [*server.CASES, *run_folder.CASES, *values.CASES, *private_data.CASES, *finetune.CASES]

__all__ = ["EXTRA_CASES"]
