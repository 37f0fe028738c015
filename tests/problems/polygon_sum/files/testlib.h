// testlib.h stands here in a real package; the judge image has its own.
