#include "inferd/guarded_copy.h"

#include <pthread.h>
#include <ucontext.h>

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace inferd {
namespace {

// The copy this thread is in, if any: where the handler jumps to.
thread_local sigjmp_buf* t_copy = nullptr;
struct sigaction g_previous{};
std::once_flag g_installed;

void on_sigbus(int signal, siginfo_t* info, void* context) {
  sigjmp_buf* copy = t_copy;
  if (copy != nullptr) {
    t_copy = nullptr;
    // Back to the signal mask the copy ran with before the jump: sigsetjmp does not save it (a
    // system call per copy), and SA_NODEFER keeps SIGBUS unblocked only while this is the handler
    // the kernel called. Under a wrapper that calls it with signals blocked (ThreadSanitizer's),
    // the next fault of this thread would otherwise find SIGBUS blocked and kill the process.
    if (context != nullptr) pthread_sigmask(SIG_SETMASK, &static_cast<ucontext_t*>(context)->uc_sigmask, nullptr);
    siglongjmp(*copy, 1);
  }
  // Not a guarded copy's fault: what would have happened without us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(signal, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(signal);
    return;
  }
  // Sent by another process (kill -BUS, si_code <= 0) where it was ignored before us: still ignored.
  if (g_previous.sa_handler == SIG_IGN && info != nullptr && info->si_code <= 0) return;
  // Otherwise the default: die of it. Raised again rather than returned from: returning repeats a
  // fault, but not a signal that was sent (kill -BUS), which would be swallowed. SA_NODEFER: it is
  // not blocked here, so it is delivered before raise returns.
  std::signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void install() {
  struct sigaction action{};
  action.sa_sigaction = on_sigbus;
  // SA_NODEFER: SIGBUS stays unblocked after the jump, so sigsetjmp need not save the mask
  // (which would cost a system call per copy).
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

bool guarded_copy(void* dst, const void* src, size_t size) {
  if (size == 0) return true;
  std::call_once(g_installed, install);
  sigjmp_buf copy;
  if (sigsetjmp(copy, 0) != 0) return false;  // the handler jumped here: t_copy is already cleared
  t_copy = &copy;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the mark is set before the first access
  std::memcpy(dst, src, size);
  std::atomic_signal_fence(std::memory_order_seq_cst);  // and cleared after the last
  t_copy = nullptr;
  return true;
}

}  // namespace inferd
