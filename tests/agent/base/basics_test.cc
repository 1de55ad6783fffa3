// The basic pieces every room shares (agent/base): the deadline-to-poll conversion, WriteAll
// through short writes and signals, WriteFileAtomically's failures, and the back-off.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/base/backoff.h"
#include "agent/base/deadline.h"
#include "agent/base/fake_clock.h"
#include "agent/base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

TEST(PollTimeoutMsTest, APassedDeadlineOnlyLooks) {
  EXPECT_EQ(PollTimeoutMs(kNow, kNow), 0);
  EXPECT_EQ(PollTimeoutMs(kNow - absl::Milliseconds(1), kNow), 0);
  EXPECT_EQ(PollTimeoutMs(absl::InfinitePast(), kNow), 0);
}

TEST(PollTimeoutMsTest, TimeLeftRoundsUpSoThatATimeoutIsPastTheDeadline) {
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Nanoseconds(1), kNow), 1);
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Microseconds(999), kNow), 1);
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Milliseconds(1), kNow), 1);
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Milliseconds(1) + absl::Nanoseconds(1), kNow), 2);
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Seconds(10), kNow), 10000);
}

TEST(PollTimeoutMsTest, FarDeadlinesAreCappedAndTheInfiniteFutureWaitsForever) {
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Hours(24 * 365), kNow), 1 << 30);
  EXPECT_EQ(PollTimeoutMs(kNow + absl::Milliseconds(1 << 30), kNow), 1 << 30);
  EXPECT_EQ(PollTimeoutMs(absl::InfiniteFuture(), kNow), -1);
}

TEST(PollTimeoutMsTest, APollThatTimesOutEndsAtOrAfterTheDeadline) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(20) + absl::Microseconds(300);
  pollfd p = {fds[0], POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, PollTimeoutMs(deadline, absl::Now()));
  } while (n < 0 && errno == EINTR);
  EXPECT_EQ(n, 0);
  EXPECT_GE(absl::Now(), deadline);
  close(fds[0]);
  close(fds[1]);
}

class Pipe {
 public:
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    read_ = fds[0];
    write_ = fds[1];
  }
  ~Pipe() {
    if (read_ >= 0) close(read_);
    if (write_ >= 0) close(write_);
  }
  int read_fd() const { return read_; }
  int write_fd() const { return write_; }
  void CloseRead() {
    close(read_);
    read_ = -1;
  }
  // Everything until the write end is closed.
  std::string ReadToEof() {
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = read(read_, buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  void CloseWrite() {
    close(write_);
    write_ = -1;
  }

 private:
  int read_ = -1, write_ = -1;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);
  return s;
}

// A pipe of one page takes a write of 1 MiB in pieces: each write(2) returns short.
TEST(WriteAllTest, ShortWritesAreContinuedUntilEverythingIsWritten) {
  Pipe p;
  ASSERT_GE(fcntl(p.write_fd(), F_SETPIPE_SZ, 4096), 0);
  const std::string data = Pattern(1 << 20);
  std::string got;
  std::thread reader([&] { got = p.ReadToEof(); });
  absl::Status st = agent::WriteAll(p.write_fd(), data, "write pipe");
  p.CloseWrite();
  reader.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(got.size(), data.size());
  EXPECT_TRUE(got == data);
}

std::atomic<int> signals_taken{0};
void CountSignal(int) { signals_taken.fetch_add(1); }

// Signals that interrupt a write blocked on a full pipe (EINTR, or a short write when part of it
// went through) lose and repeat nothing. The handler is installed without SA_RESTART, so the
// kernel returns to WriteAll instead of restarting the write.
TEST(WriteAllTest, SignalsDuringABlockedWriteLoseAndRepeatNothing) {
  struct sigaction sa = {};
  sa.sa_handler = CountSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  struct sigaction old;
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  signals_taken = 0;

  Pipe p;
  ASSERT_GE(fcntl(p.write_fd(), F_SETPIPE_SZ, 4096), 0);
  const std::string data = Pattern(256 << 10);
  std::atomic<bool> done{false};
  absl::Status st;
  pthread_t writer_thread;
  absl::Notification started;
  std::thread writer([&] {
    writer_thread = pthread_self();
    started.Notify();
    st = agent::WriteAll(p.write_fd(), data, "write pipe");
    done = true;
  });
  started.WaitForNotification();
  // Nothing reads yet: the writer fills the pipe and blocks. Signal it until it has taken a few
  // (each one either interrupts the blocked write or lands between two writes).
  // A signal sent while one is pending merges with it: each counted one was delivered.
  while (signals_taken.load() < 20 && !done.load()) {
    pthread_kill(writer_thread, SIGUSR1);
    sched_yield();
  }
  EXPECT_FALSE(done.load()) << "the writer finished against a full pipe nobody read";
  std::string got;
  std::thread reader([&] { got = p.ReadToEof(); });
  writer.join();
  p.CloseWrite();
  reader.join();
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_GE(signals_taken.load(), 20);
  EXPECT_TRUE(got == data) << "got " << got.size() << " of " << data.size() << " bytes";
}

TEST(WriteAllTest, AnErrorNamesErrnoAndWhatWasWritten) {
  Pipe p;
  p.CloseRead();
  struct sigaction ignore = {}, old;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &old), 0);
  absl::Status st = agent::WriteAll(p.write_fd(), "x", "write the test pipe");
  sigaction(SIGPIPE, &old, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("write the test pipe"));
  EXPECT_THAT(st.message(), HasSubstr("EPIPE"));
}

class WriteFileAtomicallyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-base-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> Entries() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

TEST_F(WriteFileAtomicallyTest, ReplacesTheFileWithItsModeAndLeavesNoTemporary) {
  ASSERT_TRUE(agent::WriteFileAtomically(dir_, "state.json", "old", 0600).ok());
  ASSERT_TRUE(agent::WriteFileAtomically(dir_, "state.json", "new", 0644).ok());
  auto read = agent::ReadSmallFile(dir_ + "/state.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "new");
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/state.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(Entries(), std::vector<std::string>{"state.json"});
}

// The rename fails (a directory holds the name): the error says so, the old content stays and
// the temporary file is gone.
TEST_F(WriteFileAtomicallyTest, AFailedRenameLeavesNoTemporaryFile) {
  fs::create_directories(dir_ + "/state.json/inside");
  absl::Status st = agent::WriteFileAtomically(dir_, "state.json", "data");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("rename"));
  EXPECT_EQ(Entries(), std::vector<std::string>{"state.json"});
  EXPECT_TRUE(fs::is_directory(dir_ + "/state.json/inside"));
}

// A temporary file a crash left behind, read-only and with the wrong content, is replaced.
TEST_F(WriteFileAtomicallyTest, ATemporaryFileACrashLeftIsReplaced) {
  {
    int fd = open((dir_ + "/state.json" + agent::kTmpSuffix).c_str(), O_CREAT | O_WRONLY, 0400);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "stale stale stale", 17), 17);
    close(fd);
  }
  ASSERT_TRUE(agent::WriteFileAtomically(dir_, "state.json", "fresh", 0600).ok());
  auto read = agent::ReadSmallFile(dir_ + "/state.json");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "fresh");
  EXPECT_EQ(Entries(), std::vector<std::string>{"state.json"});
}

TEST_F(WriteFileAtomicallyTest, AMissingDirectoryFailsWithoutCreatingAnything) {
  absl::Status st = agent::WriteFileAtomically(dir_ + "/absent", "state.json", "data");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("ENOENT"));
  EXPECT_TRUE(Entries().empty());
}

TEST(BackoffTest, GrowsByItsFactorUpToTheCap) {
  FakeClock clock;
  Backoff b({.initial = absl::Milliseconds(100),
             .factor = 2,
             .cap = absl::Milliseconds(500),
             .jitter = 0},
            &clock, nullptr);
  std::vector<absl::Duration> got;
  for (int i = 0; i < 5; ++i) got.push_back(b.Next());
  EXPECT_EQ(got, (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                              absl::Milliseconds(400), absl::Milliseconds(500),
                                              absl::Milliseconds(500)}));
  EXPECT_EQ(b.Next(absl::Milliseconds(50)), absl::Milliseconds(50));  // a lower cap for one call
}

TEST(BackoffTest, JitterStretchesADelayWithinTheCap) {
  FakeClock clock;
  Backoff b({.initial = absl::Milliseconds(100),
             .factor = 2,
             .cap = absl::Milliseconds(300),
             .jitter = 1},
            &clock, [] { return 0.5; });
  EXPECT_EQ(b.Next(), absl::Milliseconds(150));
  EXPECT_EQ(b.Next(), absl::Milliseconds(300));  // 200 * 1.5, capped
}

TEST(BackoffTest, StartsOverAfterAQuietPeriodOrAReset) {
  FakeClock clock;
  Backoff b({.initial = absl::Milliseconds(100),
             .factor = 2,
             .cap = absl::Seconds(10),
             .jitter = 0,
             .reset_after = absl::Minutes(1)},
            &clock, nullptr);
  b.Next();
  b.Next();
  clock.Advance(absl::Minutes(1));  // not more than reset_after: the sequence goes on
  EXPECT_EQ(b.Next(), absl::Milliseconds(400));
  clock.Advance(absl::Minutes(1) + absl::Milliseconds(1));
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
  b.Next();
  b.Reset();
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

}  // namespace
}  // namespace sluice
