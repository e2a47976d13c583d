// toolchain_clang.cpp — toolchain.h on Clang 16's and lld 16's libraries. Clang's driver
// (clang::driver::Driver) plans the jobs of a clang command line exactly as the clang
// binary would: the cc1 arguments of each compile, and the link line with the C runtime's
// start files and the library search paths of this system. Compiles run in a
// CompilerInstance (EmitObjAction), links in lld's ELF driver; nothing is exec'd, so no
// compiler or linker needs to be on PATH. The driver is given the path the clang binary
// would have (KILN_CLANG_PATH): it finds Clang's resource directory (its stddef.h, omp.h)
// relative to it, and the binary itself need not exist.
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
#include <lld/Common/CommonLinkerContext.h>
#include <lld/Common/Driver.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

// The link job: lld's ELF driver on the driver's link line.
bool run_link(const llvm::opt::ArgStringList &args, llvm::raw_ostream &os)
{
    std::vector<const char *> argv;
    argv.push_back("ld.lld");
    argv.insert(argv.end(), args.begin(), args.end());
    std::lock_guard<std::mutex> lock(link_mutex);
    bool ok = lld::elf::link(argv, os, os, /*exitEarly=*/false, /*disableOutput=*/false);
    lld::CommonLinkerContext::destroy(); // what lld's own main does after each link
    return ok;
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
    *log = nullptr;
    if (!text.empty()) {
        *log = static_cast<char *>(malloc(text.size() + 1));
        if (*log) memcpy(*log, text.c_str(), text.size() + 1);
    }
    return rc;
}
