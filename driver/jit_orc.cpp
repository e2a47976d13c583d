// jit_orc.cpp — jit.h on Clang 16 and LLVM 16's ORC. A compile is planned by Clang's driver
// from a clang command line, as the clang binary (and toolchain_clang.cpp) would: the cc1
// arguments, with -march=native turned into this CPU's model and features. It runs in a
// CompilerInstance whose output stream is memory and whose file system has the source in
// memory over the real one (the includes). The objects are linked by LLJIT, for the host's
// target machine, into this process: undefined symbols resolve through the process's
// global symbols (dlsym), which is why the kiln command exports the runtime's and links
// libomp (CMakeLists.txt), and loads OpenBLAS with jit_load_library.
#include "jit.h"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/Compilation.h>
#include <clang/Driver/Driver.h>
#include <clang/Driver/Job.h>
#include <clang/Driver/Tool.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/VirtualFileSystem.h>
#include <llvm/Support/raw_ostream.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct KilnJit {
    std::unique_ptr<llvm::orc::LLJIT> jit;
};

namespace {

std::once_flag targets_once;

void init_targets()
{
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
}

// text as a malloc'd C string for *log, or NULL when empty.
char *to_log(const std::string &text)
{
    if (text.empty()) return nullptr;
    char *s = static_cast<char *>(malloc(text.size() + 1));
    if (s) memcpy(s, text.c_str(), text.size() + 1);
    return s;
}

void set_log(char **log, const std::string &text)
{
    if (log) *log = to_log(text);
}

std::string error_text(llvm::Error e)
{
    std::string s;
    llvm::raw_string_ostream os(s);
    os << e;
    return os.str();
}

// One cc1 job of the driver's plan, its object into out.
bool run_compile_to_memory(const llvm::opt::ArgStringList &args, llvm::IntrusiveRefCntPtr<llvm::vfs::FileSystem> fs,
                           llvm::SmallVectorImpl<char> &out, llvm::raw_ostream &os)
{
    auto ci = std::make_unique<clang::CompilerInstance>();
    auto opts = llvm::makeIntrusiveRefCnt<clang::DiagnosticOptions>();
    clang::DiagnosticsEngine diags(llvm::makeIntrusiveRefCnt<clang::DiagnosticIDs>(), opts,
                                   new clang::TextDiagnosticPrinter(os, opts.get()));
    if (!clang::CompilerInvocation::CreateFromArgs(ci->getInvocation(), args, diags)) return false;
    ci->createDiagnostics(new clang::TextDiagnosticPrinter(os, &ci->getDiagnosticOpts()), true);
    ci->setVerboseOutputStream(os);
    ci->createFileManager(fs);
    ci->setOutputStream(std::make_unique<llvm::raw_svector_ostream>(out));
    clang::EmitObjAction action;
    return ci->ExecuteAction(action);
}

} // namespace

extern "C" bool jit_available(void) { return true; }

extern "C" int jit_compile_c(const char *name, const char *code, size_t len, const char *const *flags, int nflags, JitObject *obj,
                             char **log)
{
    std::call_once(targets_once, init_targets);
    obj->data = nullptr;
    obj->size = 0;
    std::string text;
    llvm::raw_string_ostream os(text);
    bool ok = false;
    llvm::SmallVector<char, 0> out;
    {
        // the source in memory, over the real file system (its includes, Clang's headers)
        auto mem = llvm::makeIntrusiveRefCnt<llvm::vfs::InMemoryFileSystem>();
        mem->addFile(name, 0, llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(code, len), name));
        auto fs = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(llvm::vfs::getRealFileSystem());
        fs->pushOverlay(mem);
        auto opts = llvm::makeIntrusiveRefCnt<clang::DiagnosticOptions>();
        clang::DiagnosticsEngine diags(llvm::makeIntrusiveRefCnt<clang::DiagnosticIDs>(), opts,
                                       new clang::TextDiagnosticPrinter(os, opts.get()));
        clang::driver::Driver driver(KILN_CLANG_PATH, llvm::sys::getDefaultTargetTriple(), diags, "kiln", fs);
        std::string objname = std::string(name) + ".o";
        std::vector<const char *> argv;
        argv.push_back(KILN_CLANG_PATH);
        argv.insert(argv.end(), flags, flags + nflags);
        argv.insert(argv.end(), {"-c", name, "-o", objname.c_str()});
        std::unique_ptr<clang::driver::Compilation> c(driver.BuildCompilation(argv));
        if (c && !diags.hasErrorOccurred()) {
            int jobs = 0;
            for (const auto &job : c->getJobs()) {
                const auto &cmd = llvm::cast<clang::driver::Command>(job);
                if (++jobs > 1 || std::string(cmd.getCreator().getName()) != "clang") {
                    os << "kiln: the JIT compiles one C file: clang planned a '" << cmd.getCreator().getName() << "' step\n";
                    ok = false;
                    break;
                }
                ok = run_compile_to_memory(cmd.getArguments(), fs, out, os);
            }
        }
    }
    os.flush();
    if (ok) {
        obj->data = static_cast<char *>(malloc(out.size() ? out.size() : 1));
        if (!obj->data) {
            ok = false;
            text += "kiln: out of memory for the object code\n";
        } else {
            memcpy(obj->data, out.data(), out.size());
            obj->size = out.size();
        }
    }
    *log = to_log(text);
    return ok ? 0 : -1;
}

extern "C" void jit_object_free(JitObject *obj)
{
    free(obj->data);
    obj->data = nullptr;
    obj->size = 0;
}

extern "C" int jit_check_object(const void *data, size_t size, char **log)
{
    *log = nullptr;
    llvm::MemoryBufferRef ref(llvm::StringRef(static_cast<const char *>(data), size), "object");
    auto obj = llvm::object::ObjectFile::createObjectFile(ref);
    if (!obj) {
        set_log(log, "not an object file: " + error_text(obj.takeError()));
        return -1;
    }
    llvm::object::ObjectFile &o = **obj;
    if (!o.isELF() || o.getArch() != llvm::Triple(llvm::sys::getProcessTriple()).getArch()) {
        set_log(log, "not an ELF object for this machine");
        return -1;
    }
    // RuntimeDyld, LLJIT's linker here, stops the process on thread-local storage
    for (const llvm::object::SectionRef &sec : o.sections()) {
        auto name = sec.getName();
        if (name && (name->startswith(".tdata") || name->startswith(".tbss"))) {
            set_log(log, "it has thread-local storage (section " + name->str() + "), which the JIT cannot link");
            return -1;
        }
    }
    return 0;
}

extern "C" KilnJit *jit_new(char **log)
{
    std::call_once(targets_once, init_targets);
    *log = nullptr;
    // the host's triple, CPU and features: the objects are -march=native's, and anything
    // LLJIT itself generates is for the same machine
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!jtmb) {
        set_log(log, "kiln: the JIT cannot describe this machine: " + error_text(jtmb.takeError()));
        return nullptr;
    }
    jtmb->setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
    auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
    if (!jit) {
        set_log(log, "kiln: cannot start the JIT: " + error_text(jit.takeError()));
        return nullptr;
    }
    auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess((*jit)->getDataLayout().getGlobalPrefix());
    if (!gen) {
        set_log(log, "kiln: the JIT cannot search this process's symbols: " + error_text(gen.takeError()));
        return nullptr;
    }
    (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
    auto *j = new KilnJit;
    j->jit = std::move(*jit);
    return j;
}

extern "C" int jit_add_object(KilnJit *j, const char *name, const void *data, size_t size, char **log)
{
    *log = nullptr;
    auto buf = llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(static_cast<const char *>(data), size), name);
    if (llvm::Error e = j->jit->addObjectFile(std::move(buf))) {
        set_log(log, std::string("kiln: the JIT cannot load ") + name + ": " + error_text(std::move(e)));
        return -1;
    }
    return 0;
}

extern "C" int jit_load_library(const char *path, char **log)
{
    *log = nullptr;
    std::string err;
    if (llvm::sys::DynamicLibrary::LoadLibraryPermanently(path, &err)) {
        set_log(log, std::string("kiln: cannot load ") + path + ": " + err);
        return -1;
    }
    return 0;
}

extern "C" void *jit_lookup(KilnJit *j, const char *name, char **log)
{
    *log = nullptr;
    auto addr = j->jit->lookup(name);
    if (!addr) {
        set_log(log, std::string("kiln: the JIT cannot link the model (looking up ") + name + "): " + error_text(addr.takeError()));
        return nullptr;
    }
    return addr->toPtr<void *>();
}

extern "C" void jit_free(KilnJit *j) { delete j; }
