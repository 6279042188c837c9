// A tiny program run through accelerate::launch, for the launcher's tests: every rank writes
// its pid, and appends what its attempt looked like to env_rank<r>.txt ("attempt world allow",
// "-" for a variable not set); one rank may fail with a chosen code or signal, the others sleep
// until stopped.
#include <accelerate/launch/launch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    int fail_rank = -1, code = 0, signal = 0;
    double sleep_seconds = 60;
    std::string pid_dir = ".";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--fail-rank") fail_rank = std::atoi(argv[i + 1]);
      else if (flag == "--code") code = std::atoi(argv[i + 1]);
      else if (flag == "--signal") signal = std::atoi(argv[i + 1]);
      else if (flag == "--sleep") sleep_seconds = std::atof(argv[i + 1]);
      else if (flag == "--pid-dir") pid_dir = argv[i + 1];
      else {
        std::cerr << "launch_probe: unexpected argument " << flag << "\n";
        return 2;
      }
    }
    const char* rank_text = std::getenv("RANK");
    const int rank = rank_text ? std::atoi(rank_text) : -1;
    std::ofstream(pid_dir + "/rank" + std::to_string(rank) + ".pid")
        << ::getpid() << " " << (std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "-") << " "
        << (std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "-") << "\n";
    auto variable = [](const char* name) { return std::string(std::getenv(name) ? std::getenv(name) : "-"); };
    std::ofstream(pid_dir + "/env_rank" + std::to_string(rank) + ".txt", std::ios::app)
        << variable("ACCELERATE_RESTART_COUNT") << " " << variable("WORLD_SIZE") << " "
        << variable("ACCELERATE_ALLOW_WORLD_SIZE_CHANGE") << "\n";
    if (rank == fail_rank) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (signal != 0) ::raise(signal);
      return code;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_seconds));
    return 0;
  });
}
