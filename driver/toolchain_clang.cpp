// toolchain_clang.cpp — toolchain.h on Clang 16's and lld 16's libraries. Clang's driver
// (clang::driver::Driver) plans the jobs of a clang command line exactly as the clang
// binary would: the cc1 arguments of each compile, and the link line with the C runtime's
// start files and the library search paths of this system. Compiles run in a
// CompilerInstance (EmitObjAction), links in lld's ELF driver; nothing is exec'd, so no
// compiler or linker needs to be on PATH. The driver is given the path the clang binary
// would have (KILN_CLANG_PATH): it finds Clang's resource directory (its stddef.h, omp.h)
// relative to it, and the binary itself need not exist. A library's build (kiln build
// --lib) also needs objcopy's and ar's work: LLVM's ObjCopy library and archive writer.
#include "toolchain.h"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/Basic/Version.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/Compilation.h>
#include <clang/Driver/Driver.h>
#include <clang/Driver/Job.h>
#include <clang/Driver/Tool.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/FrontendActions.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <lld/Common/Driver.h>
#include <llvm/ObjCopy/ConfigManager.h>
#include <llvm/ObjCopy/ObjCopy.h>
#include <llvm/Object/ArchiveWriter.h>
#include <llvm/Object/Binary.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

std::once_flag targets_once;
std::mutex link_mutex;

void init_targets()
{
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
}

// One compile job: the cc1 arguments the driver planned, in a CompilerInstance.
bool run_compile(const llvm::opt::ArgStringList &args, llvm::raw_ostream &os)
{
    auto ci = std::make_unique<clang::CompilerInstance>();
    auto opts = llvm::makeIntrusiveRefCnt<clang::DiagnosticOptions>();
    clang::DiagnosticsEngine diags(llvm::makeIntrusiveRefCnt<clang::DiagnosticIDs>(), opts,
                                   new clang::TextDiagnosticPrinter(os, opts.get()));
    if (!clang::CompilerInvocation::CreateFromArgs(ci->getInvocation(), args, diags)) return false;
    ci->createDiagnostics(new clang::TextDiagnosticPrinter(os, &ci->getDiagnosticOpts()), true);
    ci->setVerboseOutputStream(os); /* "N warnings generated." into the log, not on stderr */
    if (ci->getFrontendOpts().ProgramAction == clang::frontend::GeneratePCH) { /* -x c-header: the pieces' header */
        clang::GeneratePCHAction action;
        return ci->ExecuteAction(action);
    }
    clang::EmitObjAction action;
    return ci->ExecuteAction(action);
}

// The link job: lld's ELF driver on the driver's link line, in a child process forked
// for it. lld 16 keeps state between links that its CommonLinkerContext does not reset
// (an -r link after an executable's crashes in free()), so every link starts from a
// process in which lld never ran; the child sends its messages back through a pipe and
// leaves with _exit (the parent's stdio buffers are not flushed twice). Callers link
// after their compiles have finished: no other thread holds a lock the child needs.
bool run_link(const llvm::opt::ArgStringList &args, llvm::raw_ostream &os)
{
    std::vector<const char *> argv;
    argv.push_back("ld.lld");
    // One thread: lld's thread pool, started in the fresh child for every link, made a
    // rebuild's link of gpt2-124m (130 objects, a 1.3 MB program) 40-50 ms on 2 cores
    // against 15 ms alone.
    argv.push_back("--threads=1");
    argv.insert(argv.end(), args.begin(), args.end());
    std::lock_guard<std::mutex> lock(link_mutex);
    int fds[2];
    if (pipe(fds) != 0) {
        os << "kiln: cannot start the linker: " << strerror(errno) << "\n";
        return false;
    }
    pid_t pid = fork();
    if (pid < 0) {
        os << "kiln: cannot start the linker: " << strerror(errno) << "\n";
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        close(fds[0]);
        std::string text;
        llvm::raw_string_ostream child_os(text);
        bool ok = lld::elf::link(argv, child_os, child_os, /*exitEarly=*/false, /*disableOutput=*/false);
        child_os.flush();
        for (size_t at = 0; at < text.size();) {
            ssize_t put = write(fds[1], text.data() + at, text.size() - at);
            if (put < 0 && errno == EINTR) continue;
            if (put <= 0) break;
            at += (size_t)put;
        }
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    char chunk[4096];
    for (;;) {
        ssize_t got = read(fds[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        os.write(chunk, (size_t)got);
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) os << "kiln: the linker (lld) died of signal " << WTERMSIG(status) << "\n";
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// *log: the text (malloc'd), or NULL when there is none.
void give_log(const std::string &text, char **log)
{
    *log = nullptr;
    if (!text.empty()) {
        *log = static_cast<char *>(malloc(text.size() + 1));
        if (*log) memcpy(*log, text.c_str(), text.size() + 1);
    }
}

// keep_globals's work; false with the reason in os.
bool keep_globals(const char *in, const char *out, const char *syms_file, llvm::raw_ostream &os)
{
    // the names' text must outlive the config, whose matchers refer to it
    auto syms = llvm::MemoryBuffer::getFile(syms_file);
    if (!syms) {
        os << syms_file << ": " << syms.getError().message();
        return false;
    }
    llvm::objcopy::ConfigManager config;
    config.Common.InputFilename = in;
    config.Common.OutputFilename = out;
    llvm::SmallVector<llvm::StringRef, 64> lines;
    (*syms)->getBuffer().split(lines, '\n');
    for (llvm::StringRef line : lines) { // as llvm-objcopy reads the file
        line = line.split('#').first.trim();
        if (line.empty()) continue;
        auto name = llvm::objcopy::NameOrPattern::create(line, llvm::objcopy::MatchStyle::Literal, [](llvm::Error e) { return e; });
        if (llvm::Error e = config.Common.SymbolsToKeepGlobal.addMatcher(std::move(name))) {
            os << syms_file << ": " << llvm::toString(std::move(e));
            return false;
        }
    }
    auto binary = llvm::object::createBinary(in);
    if (!binary) {
        os << in << ": " << llvm::toString(binary.takeError());
        return false;
    }
    std::error_code ec;
    llvm::raw_fd_ostream file(out, ec);
    if (ec) {
        os << out << ": " << ec.message();
        return false;
    }
    if (llvm::Error e = llvm::objcopy::executeObjcopyOnBinary(config, *binary->getBinary(), file)) {
        os << in << ": " << llvm::toString(std::move(e));
        return false;
    }
    file.close();
    if (file.has_error()) {
        os << out << ": " << file.error().message();
        file.clear_error();
        return false;
    }
    return true;
}

} // namespace

extern "C" bool toolchain_available(void) { return true; }

extern "C" const char *toolchain_version(void)
{
    static const std::string v = "clang " CLANG_VERSION_STRING " (in process)";
    return v.c_str();
}

extern "C" int toolchain_run(const char *const *args, int nargs, char **log)
{
    std::call_once(targets_once, init_targets);
    std::string text;
    llvm::raw_string_ostream os(text);
    int rc = 0;
    {
        auto opts = llvm::makeIntrusiveRefCnt<clang::DiagnosticOptions>();
        clang::DiagnosticsEngine diags(llvm::makeIntrusiveRefCnt<clang::DiagnosticIDs>(), opts,
                                       new clang::TextDiagnosticPrinter(os, opts.get()));
        // the driver owns the strings of the jobs it plans: it lives as long as they run
        clang::driver::Driver driver(KILN_CLANG_PATH, llvm::sys::getDefaultTargetTriple(), diags, "kiln");
        std::vector<const char *> argv;
        argv.push_back(KILN_CLANG_PATH);
        argv.insert(argv.end(), args, args + nargs);
        std::unique_ptr<clang::driver::Compilation> c(driver.BuildCompilation(argv));
        if (!c || diags.hasErrorOccurred()) rc = -1;
        else
            for (const auto &job : c->getJobs()) {
                const auto &cmd = llvm::cast<clang::driver::Command>(job);
                const std::string tool = cmd.getCreator().getName();
                bool ok;
                if (tool == "clang") ok = run_compile(cmd.getArguments(), os);
                else if (cmd.getCreator().isLinkJob()) ok = run_link(cmd.getArguments(), os);
                else {
                    os << "kiln: the in-process toolchain cannot run clang's '" << tool << "' step\n";
                    ok = false;
                }
                if (!ok) {
                    rc = -1;
                    break;
                }
            }
    }
    os.flush();
    give_log(text, log);
    return rc;
}

extern "C" int toolchain_keep_globals(const char *in, const char *out, const char *syms_file, char **log)
{
    std::string text;
    llvm::raw_string_ostream os(text);
    bool ok = keep_globals(in, out, syms_file, os);
    os.flush();
    give_log(text, log);
    return ok ? 0 : -1;
}

extern "C" int toolchain_archive(const char *out, const char *const *members, int nmembers, char **log)
{
    std::string text;
    llvm::raw_string_ostream os(text);
    bool ok = true;
    std::vector<llvm::NewArchiveMember> m;
    for (int i = 0; i < nmembers && ok; i++) {
        auto member = llvm::NewArchiveMember::getFile(members[i], /*Deterministic=*/true);
        if (member) {
            member->MemberName = llvm::sys::path::filename(member->MemberName); // as ar names it
            m.push_back(std::move(*member));
        }
        else os << members[i] << ": " << llvm::toString(member.takeError()), ok = false;
    }
    if (ok)
        if (llvm::Error e = llvm::writeArchive(out, m, /*WriteSymtab=*/true, llvm::object::Archive::K_GNU, /*Deterministic=*/true, /*Thin=*/false))
            os << out << ": " << llvm::toString(std::move(e)), ok = false;
    os.flush();
    give_log(text, log);
    return ok ? 0 : -1;
}
