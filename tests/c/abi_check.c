/* The C header compiled as C11 and as C++17 with -Wall -Wextra -Werror (.ci/run), then linked
 * against libfetchahead.so and run: the version the library reports is the one Cargo built
 * (argv[1]), and its build information is a JSON object naming it. */
#include "fetchahead.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *version = fetchahead_version();
    const char *info = fetchahead_build_info();
    fetchahead_prefetcher_config config;
    if (argc != 2) {
        fprintf(stderr, "usage: %s VERSION\n", argv[0]);
        return 2;
    }
    if (version == NULL || strcmp(version, argv[1]) != 0) {
        fprintf(stderr, "fetchahead_version() = %s, want %s\n", version ? version : "NULL", argv[1]);
        return 1;
    }
    if (info == NULL || info[0] != '{' || strstr(info, "\"version\"") == NULL ||
        strstr(info, argv[1]) == NULL) {
        fprintf(stderr, "fetchahead_build_info() = %s\n", info ? info : "NULL");
        return 1;
    }
    if (fetchahead_prefetcher_config_default(&config) != FETCHAHEAD_OK ||
        config.completion != FETCHAHEAD_COMPLETION_FLAG || config.join != FETCHAHEAD_JOIN_TAGS) {
        fprintf(stderr, "the default config is not flag completion with tagged gathers\n");
        return 1;
    }
    printf("fetchahead %s: %s\n", version, info);
    return 0;
}
