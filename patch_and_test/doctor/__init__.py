"""``zero3-sp doctor``: does the ZeRO-3 sp gradient-scale bug touch my run (docs/doctor.md)?

``rule`` is the pure logic, ``read`` what is read from the environment and ``run_check``, ``cli`` the command.
"""
