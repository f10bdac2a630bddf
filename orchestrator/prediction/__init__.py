"""What the simulator's model predicts about configurations that were not run: one config at one load
(``modelled.py``), many changes of a config judged at a trial's own loads (``at_load.py``) and the
changes worth trying around a config (``neighbourhood.py``)."""
