#include "agent/base/files.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sluice::agent {

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    absl::StrAppend(&partial, "/", part);
    if (mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("create directory ", partial));
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync directory ", dir));
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, what);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status WriteAllAndSync(int fd, absl::string_view data, absl::string_view what) {
  if (absl::Status st = WriteAll(fd, data, what); !st.ok()) return st;
  if (fsync(fd) != 0) return ErrnoStatus(errno, what);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 absl::string_view data, mode_t mode, Durability durability) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = absl::StrCat(path, kTmpSuffix);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
  const bool sync = durability == Durability::kPowerLoss;
  absl::Status st = sync ? WriteAllAndSync(fd, data, absl::StrCat("write ", tmp))
                         : WriteAll(fd, data, absl::StrCat("write ", tmp));
  // The mode of an existing temporary file is not changed by open(2).
  if (st.ok() && fchmod(fd, mode) != 0) st = ErrnoStatus(errno, absl::StrCat("chmod ", tmp));
  close(fd);
  if (st.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!st.ok()) {
    unlink(tmp.c_str());
    return st;
  }
  return sync ? SyncDir(dir) : absl::OkStatus();
}

absl::Status ProbeWritable(const std::string& dir) {
  static const std::string kProbe(1024, 'x');
  if (absl::Status st =
          WriteFileAtomically(dir, ".write-probe", kProbe, 0600, Durability::kProcessCrash);
      !st.ok()) {
    return st;
  }
  const std::string path = absl::StrCat(dir, "/.write-probe");
  if (unlink(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("remove ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("read ", path));
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1 << 20)) {
      close(fd);
      return absl::DataLossError(absl::StrCat(path, " is larger than 1 MiB"));
    }
  }
  close(fd);
  return out;
}

}  // namespace sluice::agent
