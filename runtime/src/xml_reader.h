// A strict reader for the MSCCL XML dialect (msccl-xml.md section 1.1). It accepts exactly what the
// NCCL-derived hand-written tokenizer of the MSCCL runtimes accepts, and refuses the rest with a located
// message, so a file our reader accepts is one the real runtimes accept.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace taccl {

constexpr int kXmlMaxAttrs = 16;    // attributes beyond this are ignored, as in the runtimes
constexpr int kXmlMaxKeyLen = 255;  // keys and values
constexpr int kXmlMaxDepth = 8;     // the dialect needs 4 (algo/gpu/tb/step); deeper trees are refused

struct XmlNode {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;  // first kXmlMaxAttrs only
  int droppedAttrs = 0;
  int line = 0;
  std::vector<std::unique_ptr<XmlNode>> children;
  const std::string* find(const char* key) const {
    for (auto& kv : attrs)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
};

// Result of a parse: errors are values (pugixml style). On failure root is null and error says why.
struct XmlResult {
  std::unique_ptr<XmlNode> root;
  std::string error;  // "line N: message"
  int line = 0;
  bool ok() const { return root != nullptr; }
};

XmlResult parseXml(const std::string& text);

}  // namespace taccl
