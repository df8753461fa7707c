// What ncnn's C++ API buys on Vulkan over the pip binding (chapter 09).
//
// Reads a spec written by qtts_lib/lab/cpp_probe.py: one graph (.param/.bin), its inputs (float32 raw files with
// numpy shapes), which inputs are KV caches and which output each grows into, and the outputs a caller downloads.
// Times one call of the graph, median of `repeats` after a warm-up, three ways:
//   host      every input a host Mat, every output and cache downloaded (what the binding does, without Python)
//   resident  caches kept on the GPU as VkMat from call to call (each call's cache outputs are the next call's
//             inputs, growing one position per call), the other inputs uploaded and the outputs downloaded in the
//             same command; one submit per call
//   chained   the same, `chain` calls recorded into one command and submitted once (several extracts, one submit)
// and the floor of one submit (a 4-byte upload and download). Prints one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "gpu.h"
#include "mat.h"
#include "net.h"

struct Input {
    std::string name;
    std::vector<int> shape;  // numpy order
    ncnn::Mat mat;
};

static ncnn::Mat read_raw(const std::string& path, const std::vector<int>& s) {
    ncnn::Mat m;
    if (s.size() == 1) m.create(s[0]);
    else if (s.size() == 2) m.create(s[1], s[0]);
    else m.create(s[2], s[1], s[0]);
    size_t n = 1;
    for (int d : s) n *= d;
    if (n) {
        std::ifstream f(path, std::ios::binary);
        std::vector<float> buf(n);
        f.read(reinterpret_cast<char*>(buf.data()), n * 4);
        if (s.size() == 3) {  // c planes may be padded (cstep): copy plane by plane
            for (int c = 0; c < s[0]; c++) memcpy(m.channel(c), buf.data() + (size_t)c * s[1] * s[2], (size_t)s[1] * s[2] * 4);
        } else {
            memcpy(m.data, buf.data(), n * 4);
        }
    }
    return m;
}

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SPEC\n", argv[0]);
        return 2;
    }
    std::string param, bin;
    std::vector<Input> inputs;
    std::vector<std::pair<std::string, std::string>> caches;  // input name, output name
    std::vector<std::string> outputs;
    int repeats = 20, chain = 4;
    std::ifstream spec(argv[1]);
    std::string line;
    while (std::getline(spec, line)) {
        std::istringstream ss(line);
        std::string key;
        ss >> key;
        if (key == "param") ss >> param;
        else if (key == "bin") ss >> bin;
        else if (key == "repeats") ss >> repeats;
        else if (key == "chain") ss >> chain;
        else if (key == "output") { std::string o; ss >> o; outputs.push_back(o); }
        else if (key == "cache") { std::string i, o; ss >> i >> o; caches.push_back({i, o}); }
        else if (key == "input") {
            Input in;
            int nd;
            std::string file;
            ss >> in.name >> nd;
            in.shape.resize(nd);
            for (int& d : in.shape) ss >> d;
            ss >> file;
            in.mat = read_raw(file, in.shape);
            inputs.push_back(in);
        }
    }
    ncnn::create_gpu_instance();
    {
        ncnn::VulkanDevice* vkdev = ncnn::get_gpu_device(0);
        ncnn::Net net;
        net.opt.use_vulkan_compute = true;
        net.opt.use_fp16_packed = false;
        net.opt.use_fp16_storage = false;
        net.opt.use_fp16_arithmetic = false;
        net.opt.use_bf16_storage = false;
        net.opt.num_threads = 1;
        net.set_vulkan_device(0);
        if (net.load_param(param.c_str()) != 0 || net.load_model(bin.c_str()) != 0) {
            fprintf(stderr, "could not load %s\n", param.c_str());
            return 1;
        }
        ncnn::VkAllocator* blob = vkdev->acquire_blob_allocator();
        ncnn::VkAllocator* staging = vkdev->acquire_staging_allocator();
        ncnn::Option opt = net.opt;
        opt.blob_vkallocator = blob;
        opt.workspace_vkallocator = blob;
        opt.staging_vkallocator = staging;
        auto extractor = [&]() {
            ncnn::Extractor ex = net.create_extractor();
            ex.set_blob_vkallocator(blob);
            ex.set_workspace_vkallocator(blob);
            ex.set_staging_vkallocator(staging);
            return ex;
        };
        auto is_cache = [&](const std::string& n) {
            for (auto& c : caches) if (c.first == n) return true;
            return false;
        };

        // host: the binding's way
        std::vector<double> host;
        for (int r = 0; r <= repeats; r++) {
            double t0 = now_ms();
            ncnn::Extractor ex = extractor();
            for (auto& in : inputs) ex.input(in.name.c_str(), in.mat);
            for (auto& o : outputs) { ncnn::Mat m; ex.extract(o.c_str(), m, 1); }
            for (auto& c : caches) { ncnn::Mat m; ex.extract(c.second.c_str(), m, 1); }
            if (r) host.push_back(now_ms() - t0);
        }

        // resident: caches as VkMat across calls
        auto upload_caches = [&](std::vector<ncnn::VkMat>& gpu) {
            gpu.assign(caches.size(), ncnn::VkMat());
            ncnn::VkCompute cmd(vkdev);
            for (size_t i = 0; i < caches.size(); i++)
                for (auto& in : inputs)
                    if (in.name == caches[i].first) cmd.record_upload(in.mat, gpu[i], opt);
            cmd.submit_and_wait();
        };
        // one call recorded into cmd: the non-cache inputs uploaded, caches in from `gpu` and out into it
        auto record_call = [&](ncnn::VkCompute& cmd, std::vector<ncnn::VkMat>& gpu, std::vector<ncnn::Mat>& down) {
            ncnn::Extractor ex = extractor();
            for (auto& in : inputs) {
                if (is_cache(in.name)) continue;
                ncnn::VkMat g;
                cmd.record_upload(in.mat, g, opt);
                ex.input(in.name.c_str(), g);
            }
            for (size_t i = 0; i < caches.size(); i++) ex.input(caches[i].first.c_str(), gpu[i]);
            for (size_t k = 0; k < outputs.size(); k++) {
                ncnn::VkMat g;
                ex.extract(outputs[k].c_str(), g, cmd);
                down.emplace_back();
                cmd.record_download(g, down.back(), opt);
            }
            std::vector<ncnn::VkMat> next(caches.size());
            for (size_t i = 0; i < caches.size(); i++) ex.extract(caches[i].second.c_str(), next[i], cmd);
            gpu.swap(next);
        };
        // ms per call with `calls` calls recorded into each command (1: resident; `chain`: chained)
        auto per_call = [&](int calls) {
            std::vector<ncnn::VkMat> gpu;
            upload_caches(gpu);
            std::vector<double> times;
            for (int r = 0; r <= repeats; r++) {
                double t0 = now_ms();
                ncnn::VkCompute cmd(vkdev);
                std::vector<ncnn::Mat> down;
                for (int k = 0; k < calls; k++) record_call(cmd, gpu, down);
                cmd.submit_and_wait();
                if (r) times.push_back((now_ms() - t0) / calls);
            }
            return times;
        };
        std::vector<double> resident = per_call(1), chained = per_call(chain);
        // the floor of one submit: 4 bytes up and down
        std::vector<double> floor;
        ncnn::Mat one(1);
        one[0] = 1.f;
        for (int r = 0; r <= repeats; r++) {
            double t0 = now_ms();
            ncnn::VkCompute cmd(vkdev);
            ncnn::VkMat g;
            ncnn::Mat back;
            cmd.record_upload(one, g, opt);
            cmd.record_download(g, back, opt);
            cmd.submit_and_wait();
            if (r) floor.push_back(now_ms() - t0);
        }
        printf("{\"param\": \"%s\", \"layers\": %d, \"caches\": %d, \"repeats\": %d, \"chain\": %d, "
               "\"host_ms\": %.3f, \"resident_ms\": %.3f, \"chained_ms_per_call\": %.3f, \"submit_floor_ms\": %.3f}\n",
               param.c_str(), (int)net.layers().size(), (int)caches.size(), repeats, chain, median(host),
               median(resident), median(chained), median(floor));
        vkdev->reclaim_blob_allocator(blob);
        vkdev->reclaim_staging_allocator(staging);
    }
    ncnn::destroy_gpu_instance();
    return 0;
}
