// Bytes on the wire per sent coordinate for each sparse payload coding (issue 3, "Bytes on the
// wire"). Input: raw little-endian float32 gradients, one file per tensor; files in the same
// directory form one step. Each tensor is sparsified with the CPU kernels at --density (top-k for
// the float32 / float16 codings, Wangni for sign-scale, which is the coding made for it), encoded
// with every coding pair, decoded again as a check, and the totals are printed as Markdown:
//   1. layer-wise: one payload per tensor (LAGS-SGD), headers included;
//   2. merged: the tensors of a step concatenated into one payload (TopK-SGD, "single").
//
//   wire_bytes [--density 0.001] step0/conv1.weight.f32 step0/conv1.bias.f32 ...
// bench/wire_bytes.py produces the files from Fashion-MNIST training and runs this.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/pipeline/sparse_payload.h"
#include "kernels/sparsifier.h"

namespace {

using sparsync::pipeline::Decode;
using sparsync::pipeline::Encode;
using sparsync::IndexCoding;
using sparsync::pipeline::MaxEncodedBytes;
using sparsync::pipeline::SparseTensor;
using sparsync::pipeline::ValueCoding;
namespace kernels = sparsync::kernels;

struct Coding {
  IndexCoding index;
  ValueCoding value;
  const char* index_name;
  const char* value_name;
  const char* selector;  // kernel spec name
};

constexpr Coding kCodings[] = {
    {IndexCoding::kRaw32, ValueCoding::kFloat32, "raw int32", "float32", "topk"},
    {IndexCoding::kRaw32, ValueCoding::kFloat16, "raw int32", "float16", "topk"},
    {IndexCoding::kDeltaVarint, ValueCoding::kFloat32, "delta varint", "float32", "topk"},
    {IndexCoding::kDeltaVarint, ValueCoding::kFloat16, "delta varint", "float16", "topk"},
    {IndexCoding::kRaw32, ValueCoding::kSignScale, "raw int32", "sign + scale", "wangni"},
    {IndexCoding::kDeltaVarint, ValueCoding::kSignScale, "delta varint", "sign + scale", "wangni"},
};

struct Tensor {
  std::string name;
  std::vector<float> data;
};

struct Totals {
  int64_t payloads = 0;
  int64_t coordinates = 0;
  int64_t bytes = 0;
  int64_t full = 0;  // sign-scale: coordinates sent as float32
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wire_bytes: %s\n", what.c_str());
  std::exit(1);
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) Die("cannot open " + path);
  const std::streamsize size = in.tellg();
  if (size % 4 != 0) Die(path + ": size is not a multiple of 4");
  std::vector<float> v(static_cast<size_t>(size / 4));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(v.data()), size)) Die("cannot read " + path);
  return v;
}

class Bench {
 public:
  explicit Bench(double density) : density_(density) {}

  // Sparsifies `t` with each coding's selector, encodes, checks the decode, adds to `totals`.
  void Measure(const Tensor& t, uint64_t seed, std::vector<Totals>& totals) {
    const int64_t n = static_cast<int64_t>(t.data.size());
    for (size_t c = 0; c < std::size(kCodings); ++c) {
      const Coding& coding = kCodings[c];
      kernels::Sparsifier& s = Sparsifier(coding.selector, n);
      std::vector<int32_t> idx(static_cast<size_t>(s.MaxSelected(n)));
      std::vector<float> val(idx.size());
      kernels::SparseView out{idx.data(), val.data(), static_cast<int64_t>(idx.size()), 0};
      kernels::SparsifyContext ctx;
      ctx.seed = seed;
      const kernels::Status st =
          s.Sparsify(kernels::DenseView{t.data.data(), n, kernels::DType::kFloat32}, &out, ctx);
      if (!st.ok()) Die(t.name + ": " + st.ToString());
      idx.resize(static_cast<size_t>(out.k));
      val.resize(static_cast<size_t>(out.k));

      const SparseTensor sparse{n, idx, val};
      std::vector<uint8_t> buf(MaxEncodedBytes(n, out.k, coding.index, coding.value));
      auto bytes = Encode(sparse, coding.index, coding.value, buf);
      if (!bytes.ok()) Die(t.name + ": " + bytes.status().ToString());
      auto decoded = Decode(std::span<const uint8_t>(buf.data(), bytes.value()));
      if (!decoded.ok() || decoded->indices != idx) Die(t.name + ": payload does not decode back");
      if (coding.value == ValueCoding::kSignScale) {
        totals[c].full += buf[20] | buf[21] << 8 | buf[22] << 16 | buf[23] << 24;
      }
      totals[c].payloads += 1;
      totals[c].coordinates += out.k;
      totals[c].bytes += static_cast<int64_t>(bytes.value());
    }
  }

 private:
  kernels::Sparsifier& Sparsifier(const std::string& name, int64_t numel) {
    auto& slot = sparsifiers_[name];
    if (!slot.first) {
      kernels::SparsifierOptions options;
      options.density = density_;
      auto made = kernels::MakeSparsifier(name, options);
      if (!made.ok()) Die(made.status().ToString());
      slot.first = std::move(made).value();
    }
    if (numel > slot.second) {
      const kernels::Status st = slot.first->Prepare(numel, kernels::DType::kFloat32);
      if (!st.ok()) Die(st.ToString());
      slot.second = numel;
    }
    return *slot.first;
  }

  double density_;
  std::map<std::string, std::pair<std::unique_ptr<kernels::Sparsifier>, int64_t>> sparsifiers_;
};

void PrintTable(const char* title, const std::vector<Totals>& totals, int64_t numel) {
  std::printf("\n### %s\n\n", title);
  std::printf(
      "| index coding | value coding | selection | payloads | coordinates | "
      "bytes on the wire | bytes / coordinate | vs raw pairs |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (size_t c = 0; c < std::size(kCodings); ++c) {
    const Totals& t = totals[c];
    const double per = t.coordinates ? static_cast<double>(t.bytes) / t.coordinates : 0;
    std::string selection = kCodings[c].selector;
    if (kCodings[c].value == ValueCoding::kSignScale && t.coordinates) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " (%.1f %% full)", 100.0 * t.full / t.coordinates);
      selection += buf;
    }
    std::printf("| %s | %s | %s | %lld | %lld | %lld | %.2f | %.2fx |\n", kCodings[c].index_name,
                kCodings[c].value_name, selection.c_str(), static_cast<long long>(t.payloads),
                static_cast<long long>(t.coordinates), static_cast<long long>(t.bytes), per,
                8.0 / per);
  }
  std::printf("| int32 + float32 pairs, no header | | topk | | %lld | %lld | 8.00 | 1.00x |\n",
              static_cast<long long>(totals[0].coordinates),
              static_cast<long long>(8 * totals[0].coordinates));
  std::printf("\n(%lld gradient elements in all)\n", static_cast<long long>(numel));
}

}  // namespace

int main(int argc, char** argv) {
  double density = 0.001;
  std::vector<std::string> paths;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--density") == 0 && a + 1 < argc) {
      density = std::atof(argv[++a]);
    } else if (argv[a][0] == '-') {
      Die(std::string("usage: wire_bytes [--density D] FILE.f32...  (unknown ") + argv[a] + ")");
    } else {
      paths.push_back(argv[a]);
    }
  }
  if (paths.empty()) Die("usage: wire_bytes [--density D] FILE.f32...");

  // Tensors grouped by directory (one directory per step), in argument order.
  std::map<std::string, std::vector<Tensor>> steps;
  for (const std::string& p : paths) {
    steps[std::filesystem::path(p).parent_path().string()].push_back({p, ReadFloats(p)});
  }

  Bench bench(density);
  std::vector<Totals> layerwise(std::size(kCodings)), merged(std::size(kCodings));
  int64_t numel = 0;
  uint64_t seed = 1;
  for (const auto& [dir, tensors] : steps) {
    Tensor all{dir + " (merged)", {}};
    for (const Tensor& t : tensors) {
      bench.Measure(t, seed++, layerwise);
      all.data.insert(all.data.end(), t.data.begin(), t.data.end());
      numel += static_cast<int64_t>(t.data.size());
    }
    bench.Measure(all, seed++, merged);
  }
  std::printf("Sparse payload sizes at density %g: %zu tensors in %zu steps\n", density,
              paths.size(), steps.size());
  PrintTable("Layer-wise: one payload per tensor", layerwise, numel);
  PrintTable("Merged: one payload per step (all tensors concatenated)", merged, numel);
  return 0;
}
