#include <fstream>
#include <iostream>
#include "validate.h"

int main(int argc, char **argv) {
    std::ifstream input(argv[1]);
    long long n, a, b;
    input >> n;
    if (!(std::cin >> a >> b)) wrong(argv[3], "expected two integers");
    if (a + b != n) wrong(argv[3], "the sum is not N");
    std::string extra;
    if (std::cin >> extra) wrong(argv[3], "trailing output");
    return AC;
}
