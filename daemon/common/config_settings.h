// The table of sparsyncd's settings (config.h): each option's flag, environment variable, default,
// help text and how a value is applied. Internal to daemon/common: config.cc parses with it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "daemon/common/config.h"

namespace sparsync::config_internal {

// One configurable setting: its flag, its variable, its default and how to apply a value.
struct Setting {
  std::string flag;  // without dashes
  std::string env;
  std::string default_text;
  std::string help;
  std::function<Status(const std::string&, Config*)> apply;
  // Taken from the environment only: its flag is refused with this reason (a secret on a
  // command line is visible to every user in `ps`). Empty: a flag like any other.
  std::string flag_refused;
};

// Every setting, in the order --help lists them.
std::vector<Setting> Settings();

}  // namespace sparsync::config_internal
