#include "xml_reader.h"

#include <cstdio>
#include <cstring>

namespace taccl {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& t) : s_(t) {}

  XmlResult run() {
    XmlResult r;
    try {
      skipSpaceAndComments();
      if (pos_ >= s_.size()) fail("empty file: expected an <algo> element");
      if (startsWith("<?")) fail("XML declarations (<?xml ...?>) are not accepted by the MSCCL runtimes");
      auto root = element(0);
      skipSpaceAndComments();
      if (pos_ < s_.size()) fail("unexpected content after the root element </" + root->name + ">");
      r.root = std::move(root);
    } catch (const Failure& f) {
      r.error = "line " + std::to_string(line_) + ": " + f.msg;
      r.line = line_;
    }
    return r;
  }

 private:
  struct Failure { std::string msg; };
  [[noreturn]] void fail(const std::string& msg) { throw Failure{msg}; }

  bool startsWith(const char* p) const { return s_.compare(pos_, std::strlen(p), p) == 0; }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eof() const { return pos_ >= s_.size(); }
  void advance() {
    if (s_[pos_] == '\n') line_++;
    pos_++;
  }

  // Between tags: space, LF and CR only; comments are skipped.
  void skipSpaceAndComments() {
    for (;;) {
      while (!eof()) {
        char c = peek();
        if (c == ' ' || c == '\n' || c == '\r') advance();
        else if (c == '\t') fail("tab character between tags (only space, LF and CR are accepted)");
        else break;
      }
      if (startsWith("<!--")) {
        size_t end = s_.find("-->", pos_ + 4);
        if (end == std::string::npos) fail("unterminated comment");
        while (pos_ < end + 3) advance();
        continue;
      }
      return;
    }
  }

  static bool nameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == ':' || c == '.';
  }

  std::string name(const char* what) {
    size_t start = pos_;
    while (!eof() && nameChar(peek())) pos_++;
    if (pos_ == start) fail(std::string("expected ") + what);
    if (pos_ - start > (size_t)kXmlMaxKeyLen) fail(std::string(what) + " longer than 255 characters");
    return s_.substr(start, pos_ - start);
  }

  std::unique_ptr<XmlNode> element(int depth) {
    if (depth >= kXmlMaxDepth) fail("elements nested too deeply");
    if (peek() != '<') fail(std::string("expected '<', found '") + printable(peek()) + "'");
    pos_++;
    if (peek() == '/') fail("unexpected closing tag");
    if (peek() == '?' || peek() == '!') fail("unexpected '<" + std::string(1, peek()) + "'");
    auto node = std::make_unique<XmlNode>();
    node->line = line_;
    node->name = name("an element name");
    bool selfClosing = false;
    // Attributes: " key=\"value\"" repeated. After a value only ' ', '/' or '>' may follow. All on one line.
    for (;;) {
      char c = peek();
      if (c == '>') { pos_++; break; }
      if (c == '/') {
        pos_++;
        if (peek() != '>') fail("expected '>' after '/' in <" + node->name + ">");
        pos_++;
        selfClosing = true;
        break;
      }
      if (c != ' ') {
        if (c == '\n' || c == '\r') fail("start tag <" + node->name + "> continues on the next line");
        if (c == '\0' && eof()) fail("unterminated start tag <" + node->name + ">");
        fail("unexpected '" + printable(c) + "' in start tag <" + node->name + ">");
      }
      pos_++;
      if (peek() == ' ') fail("two spaces in start tag <" + node->name + "> (attributes are separated by one)");
      if (peek() == '>' || peek() == '/') continue;  // "<a >" and "<a />"
      std::string key = name("an attribute name");
      if (peek() != '=') fail("expected '=' right after attribute '" + key + "' (no spaces around '=')");
      pos_++;
      if (peek() != '"') fail("value of attribute '" + key + "' must be double-quoted");
      pos_++;
      size_t start = pos_;
      while (!eof() && peek() != '"') {
        if (peek() == '\n' || peek() == '\r') fail("newline inside the value of attribute '" + key + "'");
        pos_++;
      }
      if (eof()) fail("unterminated value of attribute '" + key + "'");
      if (pos_ - start > (size_t)kXmlMaxKeyLen) fail("value of attribute '" + key + "' longer than 255 characters");
      std::string value = s_.substr(start, pos_ - start);
      pos_++;  // closing quote
      char n = peek();
      if (n != ' ' && n != '/' && n != '>') {
        if (n == '\n' || n == '\r') fail("start tag <" + node->name + "> continues on the next line");
        fail("expected ' ', '/' or '>' after the value of attribute '" + key + "'");
      }
      if (node->find(key.c_str())) continue;  // as NCCL's XML reader, the first of a repeated attribute counts
      if ((int)node->attrs.size() < kXmlMaxAttrs) node->attrs.emplace_back(std::move(key), std::move(value));
      else node->droppedAttrs++;
    }
    if (selfClosing) return node;
    for (;;) {
      skipSpaceAndComments();
      if (eof()) fail("missing </" + node->name + ">");
      if (peek() != '<') fail("text content is not accepted (found '" + printable(peek()) + "' inside <" + node->name + ">)");
      if (startsWith("</")) {
        pos_ += 2;
        size_t start = pos_;
        while (!eof() && nameChar(peek())) pos_++;
        std::string closing = s_.substr(start, pos_ - start);
        if (closing != node->name) fail("closing tag </" + closing + "> does not match <" + node->name + ">");
        if (peek() != '>') fail("closing tag must be written exactly </" + node->name + ">");
        pos_++;
        return node;
      }
      if ((int)node->children.size() >= 65536) fail("too many child elements under <" + node->name + ">");
      node->children.push_back(element(depth + 1));
    }
  }

  static std::string printable(char c) {
    if (c == '\0') return "end of file";
    if (c == '\t') return "\\t";
    if ((unsigned char)c < 32 || (unsigned char)c >= 127) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", (unsigned char)c);
      return buf;
    }
    return std::string(1, c);
  }

  const std::string& s_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

XmlResult parseXml(const std::string& text) {
  if (text.find('\0') != std::string::npos) {
    XmlResult r;
    r.error = "line 1: NUL byte in file";
    r.line = 1;
    return r;
  }
  return Reader(text).run();
}

}  // namespace taccl
