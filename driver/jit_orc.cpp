// jit_orc.cpp — jit.h on LLVM 16's ORC. The objects are linked by LLJIT, for the host's
// target machine, into this process: undefined symbols resolve through the process's
// global symbols (dlsym), which is why the kiln command exports the runtime's and links
// libomp (CMakeLists.txt), and loads OpenBLAS with jit_load_library.

#include "jit.h"

#include <llvm/ADT/SmallVector.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
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

} // namespace

extern "C" bool jit_available(void) { return true; }

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
