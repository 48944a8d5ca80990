"""A drift has a size: the figures a comparison measured (``figures``), the envelope a row
of an expectation table was measured in (``envelope``), the data files those tables live in
(``table``) and the reviewed act of adopting new figures (``adopt``).

It imports nothing of the harness: the check families judge with it, the pytest face files
its verdict ("drift grew"), the command line adopts figures, the report reads its record."""
