"""The operator's view: what each site and each rule does, live.

:mod:`prexy.observe.stats` counts per site and per rule in each process
(``Observer``) and sums what the processes report (``Aggregate``);
:mod:`prexy.observe.tap` makes the records of the live request log and
filters them; :mod:`prexy.observe.page` renders a site's admin page;
:mod:`prexy.observe.cli` holds the operator's commands (``prexy log``,
``top``, ``hist``, ``rules diff``).  No Twisted here: the admin endpoint
(:mod:`prexy.admin`) and the workers' pipe carry what these modules make.
"""
