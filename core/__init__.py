"""What every tierserve package shares and nothing else: the error hierarchy
(:mod:`.errors`) and the warnings for HugeCTR parameters that are accepted but not honoured
(:mod:`.compat`).  It imports no other tierserve package."""
