// The sum as one integer (testlib): a checker of this package's own, not a standard one.
#include "testlib.h"

int main(int argc, char *argv[]) {
    registerTestlibCmd(argc, argv);
    long long expected = ans.readLong();
    long long got = ouf.readLong();
    if (!ouf.seekEof()) quitf(_pe, "extra output after the sum");
    if (got != expected) quitf(_wa, "expected %lld, got %lld", expected, got);
    quitf(_ok, "the sum is %lld", got);
}
