"""The Ray cluster and the role actors on it: the connection and the roles' start
(``roles``), resource placement (``placement``), the placement check before a launch
(``check_placement``), and readings of bounded waits over several actors (``waits``)."""
