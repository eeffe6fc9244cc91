// Being written (issue 27).
