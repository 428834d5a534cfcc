// IntuneCacheDataset: the cache that the rewrite insert_cache puts where a
// pipeline stops changing between epochs (rewrites/cache_point.cc).
//
// Its elements live in the process's CacheStore (cache_store.h) under a key
// made when the dataset is made: a hash of its input's graph, serialized as
// for a rewrite, and of the tensors that serialization passes by reference.
// The files its input may read (every string constant, and every string
// tensor it holds, that names a file when the entry is made) are checked by
// each new iterator: local files by size, modification and change time to
// the nanosecond, device and inode; files of other file systems by what
// TensorFlow's Stat gives (size, modification time), and by a fingerprint
// of their contents where it gives no time (ram://). A change empties the
// entry. When checking them costs over kMaxCheckPercent of the time an epoch
// took to read from the input, the entry is declined (no cache).
//
// The kernel's part of the cache's decision (cache_decision.h): each reason
// it finds to decline is told to the session by Iterator::Decline, the one
// place that does.
//
// An iterator returns element i from the entry while it holds it, and
// otherwise reads its input (made only then, and brought to element i by
// Skip), appending what it reads while the entry is a prefix ending at i.
// A checkpoint holds the position and, when the input was made, the input's
// state: never the cached elements of an ordered input.
//
// An input whose order may change between epochs (the rewrite's
// `unordered`) is served from the entry only when it holds the whole epoch
// (cache_store.h); otherwise each iterator reads its input from element 0 as
// if there were no cache, and the one that fills the entry does so from
// element 0 to the end. A checkpoint taken while such an epoch is served
// from the entry holds the elements not yet served: the input's next order
// is not the one they came in, so no position alone restores them.
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "intune_tf/cc/cache_decision.h"
#include "intune_tf/cc/kernels/cache_store.h"
#include "intune_tf/cc/kernels/pass_through.h"
#include "intune_tf/cc/kernels/row_store.h"
#include "intune_tf/cc/graph_walk.h"
#include "intune_tf/cc/kernels/session_registry.h"
#include "intune_tf/cc/op_names.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/graph/graph_def_builder.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_statistics.h"
#include "tensorflow/core/platform/hash.h"

namespace tensorflow {
namespace intune {
namespace {

namespace model = ::tensorflow::data::model;

// Checkpoint keys (the iterator shares its parent's prefix, so that its
// input's keys are those of the pipeline without the cache).
inline constexpr char kPositionKey[] = "intune_cache_position";
inline constexpr char kInputKey[] = "intune_cache_input";
// An unordered epoch served from the cache: the elements left, each as its
// number of components and the components.
inline constexpr char kHeldKey[] = "intune_cache_held";
// The longest string looked at as a file name.
inline constexpr size_t kMaxPathLength = 4096;
// The most a check of the files may cost, in percent of an epoch read from
// the input, before the cache is declined.
inline constexpr int64_t kMaxCheckPercent = 1;
// A check under this many microseconds of CPU never declines the cache: on
// a busy host a single stat can measure 0.2 ms of thread CPU, over 1% of a
// short epoch (16 ms), while the check costs a few microseconds.
inline constexpr int64_t kMinCheckToDeclineUs = 1000;
// Bytes read at once to fingerprint a file of a file system whose Stat
// gives no modification time.
inline constexpr size_t kFingerprintChunk = 1 << 20;
inline constexpr char kFileScheme[] = "file://";
// A constant's op and its attribute holding the tensor.
inline constexpr char kConstOp[] = "Const";
inline constexpr char kConstValueAttr[] = "value";
// The most CPU time spent finding which of a pipeline's strings name files
// (once per cache entry) before the cache is declined.
inline constexpr int64_t kMaxScanCpuUs = 2000000;
// Why a pipeline that reads tf.data service's splits is not cached.
inline constexpr char kSplitsReason[] =
    "the pipeline reads splits that tf.data service's dispatcher hands out "
    "(processing_mode distributed_epoch), different each epoch";

// The least share of an epoch of known size that a cache must have room
// for: a smaller prefix saves too little to be worth its memory.
inline constexpr int64_t kMinEpochPercent = 1;

// Why a cache of `limit` bytes would not pay on an epoch of
// `epoch_elements` (a cardinality) elements of `element_bytes`: it has room
// for under kMinEpochPercent of it, or the input never ends. Empty when it
// may pay (an unknown cardinality included).
std::string WhyNotWorthIt(int64_t limit, int64_t element_bytes,
                          int64_t epoch_elements) {
  if (epoch_elements == data::kInfiniteCardinality) {
    return "the input never ends, so no share of an epoch fits";
  }
  if (epoch_elements <= 0) return "";
  const int64_t room = limit / std::max<int64_t>(element_bytes, 1);
  if (room * 100 >= epoch_elements * kMinEpochPercent) return "";
  return absl::StrCat("the RAM budget leaves it room for ", room,
                      " of the epoch's ", epoch_elements, " elements (",
                      element_bytes, " bytes each), under ", kMinEpochPercent,
                      "%");
}

uint64_t HashTensor(const Tensor& t, uint64_t seed, bool* hashable) {
  uint64_t h = Hash64Combine(seed, static_cast<uint64_t>(t.dtype()));
  h = Hash64Combine(h, Hash64(t.shape().DebugString()));
  if (t.dtype() == DT_STRING) {
    const auto strings = t.flat<tstring>();
    for (int64_t i = 0; i < strings.size(); ++i) {
      h = Hash64Combine(h, Hash64(strings(i).data(), strings(i).size()));
    }
  } else if (t.dtype() == DT_RESOURCE) {
    // A resource is itself, not its contents: its handle names it.
    const auto handles = t.flat<ResourceHandle>();
    for (int64_t i = 0; i < handles.size(); ++i) {
      const ResourceHandle& r = handles(i);
      h = Hash64Combine(h, Hash64(absl::StrCat(r.container(), "/", r.name(),
                                               "/", r.hash_code())));
    }
  } else if (DataTypeCanUseMemcpy(t.dtype())) {
    const auto data = t.tensor_data();
    h = Hash64Combine(h, Hash64(data.data(), data.size()));
  } else {
    *hashable = false;
  }
  return h;
}

void AddCandidates(const Tensor& t,
                   std::unordered_set<std::string>* candidates) {
  if (t.dtype() != DT_STRING) return;
  const auto strings = t.flat<tstring>();
  for (int64_t i = 0; i < strings.size(); ++i) {
    const tstring& s = strings(i);
    if (s.empty() || s.size() > kMaxPathLength) continue;
    candidates->emplace(s.data(), s.size());
  }
}

// A path of the local file system, as ::stat takes it; empty for a path of
// another file system.
std::string LocalPath(const std::string& path) {
  if (absl::StartsWith(path, kFileScheme)) {
    return path.substr(sizeof(kFileScheme) - 1);
  }
  if (absl::StrContains(path, "://")) return "";
  return path;
}

// Whether `path` names a file (not a directory), on any file system.
bool IsFile(Env* env, const std::string& path) {
  const std::string local = LocalPath(path);
  if (!local.empty()) {
    struct stat st;
    return ::stat(local.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  }
  FileStatistics stat;
  return env->Stat(path, &stat).ok() && !stat.is_directory;
}

// A fingerprint of the contents of `path` (read whole), or "unreadable".
std::string ContentFingerprint(Env* env, const std::string& path,
                               uint64_t length) {
  std::unique_ptr<RandomAccessFile> file;
  if (!env->NewRandomAccessFile(path, &file).ok()) return "unreadable";
  std::string scratch(std::min<uint64_t>(length, kFingerprintChunk), '\0');
  uint64_t h = 0;
  for (uint64_t offset = 0; offset < length;) {
    absl::string_view piece;
    const Status read = file->Read(offset, scratch.size(), &piece,
                                   scratch.data());
    if (piece.empty()) break;
    h = Hash64Combine(h, Hash64(piece.data(), piece.size()));
    offset += piece.size();
    if (!read.ok()) break;
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

// The cache key of `input`, and the strings it holds that may name files.
Status KeyAndCandidates(OpKernelContext* ctx, const data::DatasetBase* input,
                        std::string* key,
                        std::unordered_set<std::string>* candidates) {
  std::vector<std::pair<std::string, Tensor>> input_list;
  data::SerializationContext::Params params(ctx);
  params.input_list = &input_list;
  params.external_state_policy = data::ExternalStatePolicy::POLICY_IGNORE;
  params.is_graph_rewrite = true;
  data::SerializationContext serialization_ctx(params);
  GraphDefBuilder builder;
  data::DatasetBase::DatasetGraphDefBuilder db(&builder);
  Node* output = nullptr;
  TF_RETURN_IF_ERROR(db.AddInputDataset(&serialization_ctx, input, &output));
  GraphDef graph;
  TF_RETURN_IF_ERROR(builder.ToGraphDef(&graph));
  uint64_t h = DeterministicProtoHash64(graph);
  bool hashable = true;
  for (const auto& [name, tensor] : input_list) {
    h = Hash64Combine(h, Hash64(name));
    h = HashTensor(tensor, h, &hashable);
    AddCandidates(tensor, candidates);
  }
  if (!hashable) {
    return errors::Unimplemented("the pipeline holds tensors of a type the "
                                 "cache cannot key");
  }
  ForEachNode(graph, [candidates](const NodeDef& node, const FunctionDef*) {
    const auto value = node.attr().find(kConstValueAttr);
    if (node.op() != kConstOp || value == node.attr().end()) return;
    Tensor t;
    if (t.FromProto(value->second.tensor())) AddCandidates(t, candidates);
  });
  *key = absl::StrCat(absl::Hex(h, absl::kZeroPad16));
  return OkStatus();
}

// CPU time of the calling thread: the check's cost, apart from the waits
// of a busy machine.
int64_t ThreadCpuMicros() {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// The candidates that name files now, in order. Sets `why_not` when
// looking at them all takes over kMaxScanCpuUs.
std::vector<std::string> Files(const std::unordered_set<std::string>& candidates,
                               std::string* why_not) {
  Env* env = Env::Default();
  std::vector<std::string> files;
  const int64_t start = ThreadCpuMicros();
  int64_t looked = 0;
  for (const std::string& path : candidates) {
    if (IsFile(env, path)) files.push_back(path);
    if (++looked % 1024 == 0 && ThreadCpuMicros() - start > kMaxScanCpuUs) {
      *why_not = absl::StrCat(
          "the pipeline holds ", candidates.size(),
          " strings that may name files, and looking at ", looked,
          " of them took over ", kMaxScanCpuUs / 1000000,
          " s of CPU: its files could not all be checked");
      return {};
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// What says that `path` is unchanged: local files by size, modification and
// change time to the nanosecond, device and inode; others by what
// TensorFlow's Stat gives, and by their contents where it gives no
// modification time (ram://).
void AppendFileSignature(Env* env, const std::string& path,
                         std::string* signature) {
  const std::string local = LocalPath(path);
  if (!local.empty()) {
    struct stat st;
    if (::stat(local.c_str(), &st) != 0) {
      absl::StrAppend(signature, path, ": gone\n");
      return;
    }
    absl::StrAppend(signature, path, ":", st.st_size, ":", st.st_mtim.tv_sec,
                    ".", st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".",
                    st.st_ctim.tv_nsec, ":", st.st_dev, ":", st.st_ino, "\n");
    return;
  }
  FileStatistics stat;
  if (!env->Stat(path, &stat).ok()) {
    absl::StrAppend(signature, path, ": gone\n");
    return;
  }
  absl::StrAppend(signature, path, ":", stat.length, ":", stat.mtime_nsec);
  if (stat.mtime_nsec == 0 && !stat.is_directory) {
    absl::StrAppend(signature, ":",
                    ContentFingerprint(env, path, stat.length));
  }
  absl::StrAppend(signature, "\n");
}

// The signature of each file, now.
std::string FilesSignature(const std::vector<std::string>& files) {
  std::string signature;
  Env* env = Env::Default();
  for (const std::string& path : files) {
    AppendFileSignature(env, path, &signature);
  }
  return signature;
}

// Why checking `files` in `check_us` of CPU costs too much against an epoch of
// `epoch_us` read from the input (over kMaxCheckPercent of it, and at least
// kMinCheckToDeclineUs); empty when it does not.
std::string WhyCheckCostsTooMuch(size_t files, int64_t check_us,
                                 int64_t epoch_us) {
  if (epoch_us <= 0 || check_us < kMinCheckToDeclineUs ||
      check_us * 100 <= epoch_us * kMaxCheckPercent) {
    return "";
  }
  return absl::StrCat("checking the ", files, " files the pipeline reads took ",
                      absl::StrFormat("%.1f", check_us / 1e3),
                      " ms of CPU, over ", kMaxCheckPercent, "% of an epoch (",
                      absl::StrFormat("%.1f", epoch_us / 1e3), " ms)");
}

class IntuneCacheDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit IntuneCacheDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kCachePointAttr, &point_));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr(kCacheUnorderedAttr, &unordered_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kCacheRowStoreAttr, &row_store_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;

  std::string point_;
  std::string unordered_;
  std::string row_store_;
};

class IntuneCacheDatasetOp::Dataset : public PassThroughDataset {
 public:
  // `entry` null: the input cannot be keyed, and the dataset passes its
  // elements through.
  Dataset(OpKernelContext* ctx, const DatasetBase* input, std::string point,
          std::string unordered, std::string row_store,
          std::shared_ptr<CacheEntry> entry, std::vector<std::string> files)
      : PassThroughDataset(ctx, input),
        point_(std::move(point)),
        unordered_(std::move(unordered)),
        row_store_(std::move(row_store)),
        entry_(std::move(entry)),
        files_(std::move(files)),
        epoch_elements_(input->Cardinality()) {
    dtypes_ = input->output_dtypes();
    shapes_ = input->output_shapes();
    if (!row_store_.empty()) {
      dtypes_.insert(dtypes_.begin(), DT_INT64);
      shapes_.insert(shapes_.begin(), PartialTensorShape({}));
    }
  }

  const DataTypeVector& output_dtypes() const override { return dtypes_; }
  const std::vector<PartialTensorShape>& output_shapes() const override {
    return shapes_;
  }

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  std::string DebugString() const override {
    return "IntuneCacheDatasetOp::Dataset";
  }

 protected:
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    AttrValue point;
    b->BuildAttrValue(point_, &point);
    AttrValue unordered;
    b->BuildAttrValue(unordered_, &unordered);
    AttrValue row_store;
    b->BuildAttrValue(row_store_, &row_store);
    return b->AddDataset(this, {input_node},
                         {{kCachePointAttr, point},
                          {kCacheUnorderedAttr, unordered},
                          {kCacheRowStoreAttr, row_store}},
                         output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    ~Iterator() override {
      if (reading_) dataset()->entry_->RemoveReader();
      mutex_lock l(mu_);
      StopFilling();
    }

    Status Initialize(data::IteratorContext* ctx) override {
      mutex_lock l(mu_);
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      if (entry == nullptr) return MakeInput(ctx);
      if (ctx->model() != nullptr) {
        session_ = SessionRegistry::Global()->FindByModel(ctx->model().get());
      }
      // Split providers (tf.data service's distributed_epoch, on a worker):
      // the dispatcher hands out different splits each epoch.
      if (!ctx->split_providers().empty()) {
        // No point: no place in such a pipeline could be cached.
        Decline("", kSplitsReason);
        return OkStatus();
      }
      entry->set_point(dataset()->point_);
      std::string declined = entry->declined();
      if (declined.empty()) {
        const int64_t start = ThreadCpuMicros();
        entry->CheckFiles(FilesSignature(dataset()->files_));
        check_us_ = ThreadCpuMicros() - start;
        epoch_start_us_ = static_cast<int64_t>(Env::Default()->NowMicros());
        declined = WhyCheckCostsTooMuch(dataset()->files_.size(), check_us_,
                                        entry->input_epoch_us());
        if (!declined.empty()) entry->Decline(declined);
      }
      if (!declined.empty()) {
        Decline(dataset()->point_, declined);
        return OkStatus();
      }
      entry->BeginEpoch();
      if (!entry->ordered()) {
        snapshot_ = entry->Snapshot();
        if (snapshot_ == nullptr) filling_ = entry->ClaimFill(this);
      }
      if (entry->ordered() && !dataset()->row_store_.empty()) {
        row_store_ = entry->RowStoreFor(dataset()->row_store_);
      }
      entry->AddReader();
      reading_ = true;
      if (session_ != nullptr) session_->AttachCache(entry);
      return OkStatus();
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      mutex_lock l(mu_);
      TF_RETURN_IF_ERROR(GetNextElement(ctx, out_tensors, end_of_sequence));
      if (dataset()->row_store_.empty() || *end_of_sequence) return OkStatus();
      // The element's index in the epoch is position_ - 1 wherever the
      // entry is read or appended; elsewhere it has no store.
      Tensor position(DT_INT64, TensorShape({}));
      position.scalar<int64_t>()() =
          row_store_ != nullptr && !bypass_
              ? RowPosition(row_store_->tag(), position_ - 1)
              : -1;
      out_tensors->insert(out_tensors->begin(), std::move(position));
      return OkStatus();
    }

   private:
    Status GetNextElement(data::IteratorContext* ctx,
                          std::vector<Tensor>* out_tensors,
                          bool* end_of_sequence)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      if (entry != nullptr && !bypass_ && !entry->ordered()) {
        return GetNextUnordered(ctx, out_tensors, end_of_sequence);
      }
      if (input_impl_ == nullptr && !bypass_ && entry != nullptr) {
        if (entry->Get(position_, out_tensors)) {
          ++position_;
          input_only_ = false;
          *end_of_sequence = false;
          if (session_ != nullptr) {
            session_->RecordCacheRead(/*from_cache=*/true,
                                      entry->upstream_us_per_element());
          }
          return OkStatus();
        }
        if (entry->complete() && position_ >= entry->size()) {
          *end_of_sequence = true;
          return OkStatus();
        }
      }
      if (input_impl_ == nullptr) {
        TF_RETURN_IF_ERROR(MakeInput(ctx));
        TF_RETURN_IF_ERROR(CatchUp(ctx, end_of_sequence));
        if (*end_of_sequence) return OkStatus();
      }
      const int64_t start = static_cast<int64_t>(Env::Default()->NowMicros());
      const Status read =
          input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
      const int64_t now = static_cast<int64_t>(Env::Default()->NowMicros());
      if (entry == nullptr || bypass_) return read;
      if (Cancelled(ctx)) {
        if (read.ok() && !*end_of_sequence) ++position_;
        return read;
      }
      if (!read.ok()) return Failed(read, position_);
      if (*end_of_sequence) {
        entry->MarkEnd(position_);
        EndOfInputEpoch(now);
        return OkStatus();
      }
      // The time since the previous element: what the input took to make
      // this one, as the consumer sees it.
      const int64_t upstream =
          last_read_us_ > 0 ? now - last_read_us_ : now - start;
      last_read_us_ = now;
      if (position_ == 0 && entry->size() == 0) {
        std::string uncounted;
        const int64_t bytes = ElementBytes(*out_tensors, &uncounted);
        const std::string why =
            !uncounted.empty()
                ? absl::StrCat("the elements hold ", uncounted,
                               " values, whose bytes the cache cannot count")
                : WhyNotWorthIt(entry->limit(), bytes,
                                dataset()->epoch_elements_);
        if (!why.empty()) {
          Decline(dataset()->point_, why);
          ++position_;
          return OkStatus();
        }
      }
      entry->Append(position_, *out_tensors, upstream);
      ++position_;
      if (session_ != nullptr) session_->RecordCacheRead(false, 0);
      return OkStatus();
    }

   protected:
    std::shared_ptr<model::Node> CreateNode(
        data::IteratorContext* ctx, model::Node::Args args) const override {
      args.name = kCacheNode;
      return model::MakeKnownRatioNode(std::move(args), /*ratio=*/1);
    }

    Status SaveInternal(data::SerializationContext* ctx,
                        data::IteratorStateWriter* writer) override {
      mutex_lock l(mu_);
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kPositionKey,
                                             bypass_ ? -1 : position_));
      TF_RETURN_IF_ERROR(writer->WriteScalar(
          prefix(), kInputKey, static_cast<int64_t>(input_impl_ != nullptr)));
      if (input_impl_ != nullptr) {
        TF_RETURN_IF_ERROR(SaveInput(ctx, writer, input_impl_));
      } else if (snapshot_ != nullptr) {
        TF_RETURN_IF_ERROR(SaveHeld(writer));
      }
      return OkStatus();
    }

    Status RestoreInternal(data::IteratorContext* ctx,
                           data::IteratorStateReader* reader) override {
      mutex_lock l(mu_);
      input_impl_.reset();
      StopFilling();
      snapshot_.reset();
      snapshot_base_ = 0;
      last_read_us_ = 0;
      epoch_start_us_ = 0;
      int64_t position = -1;
      int64_t has_input = 1;
      // A checkpoint written without the cache (InTune off): the input's
      // state only; this epoch then bypasses the cache.
      if (reader->Contains(prefix(), kPositionKey)) {
        TF_RETURN_IF_ERROR(
            reader->ReadScalar(prefix(), kPositionKey, &position));
        TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputKey, &has_input));
      }
      bypass_ = dataset()->entry_ == nullptr || position < 0 ||
                !ctx->split_providers().empty();
      position_ = std::max<int64_t>(position, 0);
      if (reader->Contains(prefix(), kHeldKey)) return RestoreHeld(reader);
      if (has_input == 0) return OkStatus();
      TF_RETURN_IF_ERROR(MakeInput(ctx));
      return RestoreInput(ctx, reader, input_impl_);
    }

   private:
    // GetNextInternal for an unordered input: the whole epoch from a
    // snapshot of the entry, or else the input from element 0, appended
    // only by the entry's filler.
    Status GetNextUnordered(data::IteratorContext* ctx,
                            std::vector<Tensor>* out_tensors,
                            bool* end_of_sequence)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      if (snapshot_ != nullptr) {
        const int64_t index = position_ - snapshot_base_;
        *end_of_sequence =
            index < 0 || index >= static_cast<int64_t>(snapshot_->size());
        if (*end_of_sequence) return OkStatus();
        *out_tensors = (*snapshot_)[index];
        ++position_;
        if (session_ != nullptr) {
          session_->RecordCacheRead(/*from_cache=*/true,
                                    entry->upstream_us_per_element());
        }
        return OkStatus();
      }
      if (input_impl_ == nullptr) {
        // Only a checkpoint written without the elements it served leaves
        // a position here with no input: the best left is to skip it.
        TF_RETURN_IF_ERROR(MakeInput(ctx));
        TF_RETURN_IF_ERROR(CatchUp(ctx, end_of_sequence));
        if (*end_of_sequence) return OkStatus();
      }
      const int64_t start = static_cast<int64_t>(Env::Default()->NowMicros());
      const Status read =
          input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
      const int64_t now = static_cast<int64_t>(Env::Default()->NowMicros());
      if (!filling_ || Cancelled(ctx)) {
        StopFilling();
        if (read.ok() && !*end_of_sequence) {
          ++position_;
          if (session_ != nullptr) session_->RecordCacheRead(false, 0);
        }
        return read;
      }
      if (!read.ok()) {
        if (!errors::IsCancelled(read)) entry->FailedAt(position_);
        StopFilling();
        return read;
      }
      if (*end_of_sequence) {
        entry->MarkEnd(position_);
        filling_ = false;
        return OkStatus();
      }
      const int64_t upstream =
          last_read_us_ > 0 ? now - last_read_us_ : now - start;
      last_read_us_ = now;
      if (position_ == 0) {
        const std::string why =
            WhyNotWorthIt(entry->limit(), ElementBytes(*out_tensors),
                          dataset()->epoch_elements_);
        if (!why.empty()) {
          StopFilling();
          Decline(dataset()->point_, why);
          ++position_;
          return OkStatus();
        }
      }
      if (!entry->Append(position_, *out_tensors, upstream, this)) {
        StopFilling();
      }
      ++position_;
      if (session_ != nullptr) session_->RecordCacheRead(false, 0);
      return OkStatus();
    }

    // This iterator fills the entry no more (an unordered entry that it
    // left short empties itself).
    void StopFilling() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!filling_) return;
      filling_ = false;
      if (dataset()->entry_ != nullptr) dataset()->entry_->ReleaseFill(this);
    }

    // The elements of the snapshot not yet served, into a checkpoint.
    Status SaveHeld(data::IteratorStateWriter* writer)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const int64_t first = std::max<int64_t>(position_ - snapshot_base_, 0);
      const int64_t count =
          std::max<int64_t>(static_cast<int64_t>(snapshot_->size()) - first, 0);
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kHeldKey, count));
      for (int64_t i = 0; i < count; ++i) {
        const std::vector<Tensor>& element = (*snapshot_)[first + i];
        const std::string key = absl::StrCat(kHeldKey, "_", i);
        TF_RETURN_IF_ERROR(writer->WriteScalar(
            prefix(), key, static_cast<int64_t>(element.size())));
        for (size_t j = 0; j < element.size(); ++j) {
          TF_RETURN_IF_ERROR(writer->WriteTensor(
              prefix(), absl::StrCat(key, "_", j), element[j]));
        }
      }
      return OkStatus();
    }

    // The elements SaveHeld wrote: the rest of the epoch, from position_.
    Status RestoreHeld(data::IteratorStateReader* reader)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int64_t count = 0;
      TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kHeldKey, &count));
      if (count < 0) {
        return errors::DataLoss("a cache checkpoint holds ", count,
                                " elements");
      }
      auto held = std::make_shared<CacheEntry::Elements>();
      held->reserve(count);
      for (int64_t i = 0; i < count; ++i) {
        const std::string key = absl::StrCat(kHeldKey, "_", i);
        int64_t components = 0;
        TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), key, &components));
        if (components < 0) {
          return errors::DataLoss("a cache checkpoint's element ", i,
                                  " has ", components, " components");
        }
        std::vector<Tensor> element(components);
        for (int64_t j = 0; j < components; ++j) {
          TF_RETURN_IF_ERROR(reader->ReadTensor(
              prefix(), absl::StrCat(key, "_", j), &element[j]));
        }
        held->push_back(std::move(element));
      }
      bypass_ = false;
      snapshot_ = std::move(held);
      snapshot_base_ = position_;
      return OkStatus();
    }

    Status MakeInput(data::IteratorContext* ctx)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return dataset()->input_->MakeIterator(ctx, this, prefix(),
                                             &input_impl_);
    }

    // The input failed to give element `index`: the entry stops below it,
    // unless the read was cancelled (the iterator is going away, the element
    // did not fail). Returns `read`.
    Status Failed(const Status& read, int64_t index)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      if (entry != nullptr && !bypass_ && !errors::IsCancelled(read)) {
        entry->FailedAt(index);
      }
      return read;
    }

    // Whether the iterator is being cancelled: an input may then end early
    // or give another order (TF's legacy parallel_interleave, whose workers
    // stop), so nothing it gives then goes into the entry.
    static bool Cancelled(data::IteratorContext* ctx) {
      return ctx->cancellation_manager() != nullptr &&
             ctx->cancellation_manager()->IsCancelled();
    }

    // The input ended at `now_us`: when it gave the whole epoch, its time
    // is the entry's reference for the cost of the files' check.
    void EndOfInputEpoch(int64_t now_us) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      if (!input_only_ || epoch_start_us_ <= 0) return;
      const int64_t epoch_us = now_us - epoch_start_us_;
      entry->RecordInputEpoch(epoch_us);
      const std::string why = WhyCheckCostsTooMuch(
          dataset()->files_.size(), check_us_, epoch_us);
      if (why.empty()) return;
      entry->Decline(why);
      Decline(dataset()->point_, why);
    }

    // The cache is declined for `why` (where it was placed, `point`): this
    // iterator reads its input alone from now on, and its session, told
    // once, reads no more of it.
    void Decline(const std::string& point, const std::string& why)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      bypass_ = true;
      row_store_ = nullptr;
      if (session_ == nullptr) return;
      session_->DecideCache(CacheDecision::Declined(point, why));
      session_ = nullptr;
    }

    // Brings a new input to element position_: skips what the entry holds,
    // then reads (and appends) the rest. Without an entry, skips them all.
    Status CatchUp(data::IteratorContext* ctx, bool* end_of_sequence)
        TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      *end_of_sequence = false;
      const std::shared_ptr<CacheEntry>& entry = dataset()->entry_;
      int64_t done = 0;
      const int64_t held = entry == nullptr || bypass_
                               ? position_
                               : std::min(entry->size(), position_);
      if (held > 0) {
        int num_skipped = 0;
        TF_RETURN_IF_ERROR(
            input_impl_->Skip(ctx, static_cast<int>(held), end_of_sequence,
                              &num_skipped));
        done = num_skipped;
        if (*end_of_sequence) return OkStatus();
      }
      std::vector<Tensor> element;
      while (done < position_) {
        element.clear();
        const Status read = input_impl_->GetNext(ctx, &element, end_of_sequence);
        if (!read.ok()) return Failed(read, done);
        if (*end_of_sequence) break;
        if (entry != nullptr && !Cancelled(ctx)) {
          entry->Append(done, element, 0);
        }
        ++done;
      }
      return OkStatus();
    }

    mutex mu_;
    std::unique_ptr<data::IteratorBase> input_impl_ TF_GUARDED_BY(mu_);
    // The index in the epoch of the next element returned.
    int64_t position_ TF_GUARDED_BY(mu_) = 0;
    // Restored from a checkpoint without the cache: the input runs alone.
    bool bypass_ TF_GUARDED_BY(mu_) = false;
    int64_t last_read_us_ TF_GUARDED_BY(mu_) = 0;
    // Unordered inputs: the whole epoch this iterator serves (element i of
    // the epoch is (*snapshot_)[i - snapshot_base_]), and whether it fills
    // the entry.
    std::shared_ptr<const CacheEntry::Elements> snapshot_ TF_GUARDED_BY(mu_);
    int64_t snapshot_base_ TF_GUARDED_BY(mu_) = 0;
    bool filling_ TF_GUARDED_BY(mu_) = false;
    // When the epoch began (after the files' check), and what the check
    // took; 0 when restored from a checkpoint.
    int64_t epoch_start_us_ TF_GUARDED_BY(mu_) = 0;
    int64_t check_us_ TF_GUARDED_BY(mu_) = 0;
    // No element of this epoch came from the entry.
    bool input_only_ TF_GUARDED_BY(mu_) = true;
    // Counted among the entry's readers (CacheEntry::AddReader).
    bool reading_ = false;
    std::shared_ptr<TuningSession> session_;
    // The row store its positions name (kCacheRowStoreAttr), held for the
    // epoch: a store its entry drops meanwhile still serves this epoch's
    // batches, whose rows it computed.
    std::shared_ptr<RowStore> row_store_ TF_GUARDED_BY(mu_);
  };

  const std::string point_;
  const std::string unordered_;
  const std::string row_store_;
  const std::shared_ptr<CacheEntry> entry_;
  const std::vector<std::string> files_;
  // The input's cardinality (data::kUnknownCardinality when not known).
  const int64_t epoch_elements_;
  DataTypeVector dtypes_;
  std::vector<PartialTensorShape> shapes_;
};

void IntuneCacheDatasetOp::MakeDataset(OpKernelContext* ctx,
                                       data::DatasetBase* input,
                                       data::DatasetBase** output) {
  std::string key;
  std::unordered_set<std::string> candidates;
  std::vector<std::string> files;
  std::shared_ptr<CacheEntry> entry;
  if (KeyAndCandidates(ctx, input, &key, &candidates).ok()) {
    entry = CacheStore::Global()->Get(key, /*ordered=*/unordered_.empty());
    if (!entry->GetFiles(&files) && entry->declined().empty()) {
      std::string why_not;
      files = Files(candidates, &why_not);
      entry->SetFiles(files);
      if (!why_not.empty()) entry->Decline(why_not);
    }
  }
  *output = new Dataset(ctx, input, point_, unordered_, row_store_,
                        std::move(entry), std::move(files));
}

REGISTER_KERNEL_BUILDER(Name(kCacheOp).Device(DEVICE_CPU),
                        IntuneCacheDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
